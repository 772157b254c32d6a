"""The OpenAI-compatible API: its schemas and error JSON (`protocol`), `/v1/completions`
and `/v1/chat/completions` (`serving`), and how a chat output is read and written back
(`chat_parsing`, `chat_output`, `logprobs`, `response_format`)."""
