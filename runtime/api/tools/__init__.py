"""Tool calling on `/v1/chat/completions`: request checks, the constrained-decoding schema
of `tool_choice`, and one output parser per model family's call format."""
