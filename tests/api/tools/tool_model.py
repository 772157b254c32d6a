"""SmolLM2 with a chat template that renders tools (its own has none): a model folder of
links to SmolLM2's files and a ChatML template written for these tests, in the Hermes
format (`<tool_call>` blocks, `<tool_response>` answers) with a Qwen3-style
`enable_thinking` switch."""

from __future__ import annotations

import os
from pathlib import Path

from runtime.model_config import resolve_model

TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call these functions:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
To call one, write <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{% if m.content %}{{ m.content }}{% endif %}
{%- for call in m.tool_calls or [] %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role != 'system' %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""


def tool_model_dir(folder: Path) -> Path:
    """Fill `folder` with SmolLM2 (links) and the tools template; return it."""
    source = Path(resolve_model("smollm2").path)
    for item in source.iterdir():
        if item.name != "chat_template.jinja":
            os.symlink(item, folder / item.name)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder
