"""The Mistral format: `[TOOL_CALLS]` and a JSON array of call objects.

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
"""

from __future__ import annotations

from runtime.api.tools.call_array import CallArrayParser


class MistralParser(CallArrayParser):
    name = "mistral"
    marker = "[TOOL_CALLS]"
    template_marker = marker
