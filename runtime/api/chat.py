"""Chat messages to prompt token ids, through the model's own chat template."""

from __future__ import annotations

from typing import Any

from runtime.api.openai_protocol import ApiError, ChatMessage

ROLES = ("system", "developer", "user", "assistant", "tool")


def message_text(msg: ChatMessage) -> str:
    """A message's text: a string, or its text parts joined by newlines."""
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    texts = []
    for part in msg.content:
        if part.type != "text" or part.text is None:
            raise ApiError(400, f"content parts of type {part.type!r} are not supported "
                                "(text only)", param="messages")
        texts.append(part.text)
    return "\n".join(texts)


def chat_prompt_ids(tokenizer: Any, messages: list[ChatMessage]) -> list[int]:
    """Render `messages` with the tokenizer's chat template (plus the assistant's turn
    header) and tokenize the result as is: the template already holds special tokens."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ApiError(400, "this model has no chat template; use /v1/completions")
    if not messages:
        raise ApiError(400, "messages must not be empty", param="messages")
    conversation = []
    for msg in messages:
        if msg.role not in ROLES:
            raise ApiError(400, f"unknown message role {msg.role!r}; expected one of {ROLES}",
                           param="messages")
        turn = {"role": msg.role, "content": message_text(msg)}
        if msg.name is not None:
            turn["name"] = msg.name
        conversation.append(turn)
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False,
                                             add_generation_prompt=True)
    except Exception as e:  # the template rejects the conversation (e.g. role order)
        raise ApiError(400, f"the chat template rejected the messages: {e}",
                       param="messages") from None
    return tokenizer.encode(text, add_special_tokens=False)
