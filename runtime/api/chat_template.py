"""Chat messages to prompt text, and role markers, from the model's own chat template."""

from __future__ import annotations

import functools
import logging
from typing import Any

from runtime.api.openai.protocol import ApiError, ChatMessage
from runtime.api.tools.messages import tool_fields, tools_chars
from runtime.wire.model_info import RoleMarkers

log = logging.getLogger(__name__)

ROLES = ("system", "developer", "user", "assistant", "tool")
TURN_CHARS = 32  # what a turn costs the template beyond its content, in characters
# what apply_chat_template takes itself, and what the template is given by it
RENDER_ARGUMENTS = frozenset((
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "sanitize_control_tokens"))


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


def conversation_chars(messages: list[ChatMessage], tools_text: int = 0) -> int:
    """About how much text rendering `messages` (and tools whose definitions take
    `tools_text` characters) produces: the template's work grows with it."""
    return tools_text + sum(len(message_text(m)) + tools_chars(m) + TURN_CHARS
                            for m in messages)


def chat_prompt_text(tokenizer: Any, messages: list[ChatMessage],
                     tools: list[dict[str, Any]] | None = None,
                     template_kwargs: dict[str, Any] | None = None) -> str:
    """Render `messages` (and `tools`, and the template's own options `template_kwargs`)
    with the tokenizer's chat template, plus the assistant's turn header; tokenize the
    result as is (no special tokens added): the template already holds them."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ApiError(400, "this model has no chat template; use /v1/completions")
    if not messages:
        raise ApiError(400, "messages must not be empty", param="messages")
    options = check_template_kwargs(template_kwargs)
    render = functools.partial(tokenizer.apply_chat_template, tools=tools, tokenize=False,
                               add_generation_prompt=True, **options)
    conversation = _conversation(messages, text_arguments=False)
    try:
        try:
            text = render(conversation)
        except Exception:
            if not any(m.tool_calls for m in messages):
                raise
            # a template that joins a call's arguments to text: give it the text
            text = render(_conversation(messages, text_arguments=True))
    except Exception as e:  # the template rejects the conversation (e.g. role order)
        raise ApiError(400, f"the chat template rejected the messages: {e}",
                       param="messages") from None
    return text


def _conversation(messages: list[ChatMessage], text_arguments: bool) -> list[dict[str, Any]]:
    """The messages as the chat template takes them (see `tools.messages`)."""
    conversation = []
    for i, msg in enumerate(messages):
        if msg.role not in ROLES:
            raise ApiError(400, f"unknown message role {msg.role!r}; expected one of {ROLES}",
                           param="messages")
        turn = {"role": msg.role, "content": message_text(msg)}
        if msg.name is not None:
            turn["name"] = msg.name
        turn.update(tool_fields(msg, i, text_arguments))
        conversation.append(turn)
    return conversation


def check_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The chat template's options: not the names of what the renderer itself takes."""
    for name in kwargs or {}:
        if name in RENDER_ARGUMENTS:
            raise ApiError(400, f"chat_template_kwargs may not set {name!r}",
                           param=f"chat_template_kwargs.{name}")
    return dict(kwargs or {})


_SENTINELS = {"system": "\x1esluice-system\x1e", "user": "\x1esluice-user\x1e",
              "assistant": "\x1esluice-assistant\x1e"}


def role_markers(tokenizer: Any) -> dict[str, RoleMarkers]:
    """The chat template split into text before and after each role's content.

    Rendered with placeholder contents: a conversation's text between two contents is
    the suffix of the first (what the template puts after a final message of that role)
    followed by the prefix of the next. The split is checked by rebuilding a few
    renderings; a template that does not decompose this way gives {} (no role markers).
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return {}
    sys_, user, asst = (_SENTINELS[r] for r in ("system", "user", "assistant"))

    def render(*turns: tuple[str, str], gen: bool = False) -> str:
        msgs = [{"role": role, "content": _SENTINELS[role] if text is None else text}
                for role, text in turns]
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    try:
        full = render(("system", None), ("user", None), ("assistant", None))
        before_sys, rest = full.split(sys_)
        sys_to_user, rest = rest.split(user)
        user_to_asst, after_asst = rest.split(asst)
        suffix = {"system": render(("system", None)).split(sys_)[1],
                  "user": render(("system", None), ("user", None)).split(user)[1],
                  "assistant": after_asst}
        prefix = {"user": _drop_start(sys_to_user, suffix["system"]),
                  "assistant": _drop_start(user_to_asst, suffix["user"])}
        first = {"system": before_sys, "user": render(("user", None)).split(user)[0]}
        gen_prompt = render(("system", None), ("user", None), gen=True)
    except Exception as e:  # the template refuses these conversations or drops contents
        log.warning("chat template not split into role markers: %r", e)
        return {}
    prefix["system"] = before_sys  # a later system message: rare, taken as the first
    try:
        first["assistant"] = render(("assistant", None)).split(asst)[0]
    except Exception:  # templates that insist on a user turn first
        first["assistant"] = prefix["assistant"]
    markers = {r: RoleMarkers(first_prefix=first[r], prefix=prefix[r], suffix=suffix[r])
               for r in ("system", "user", "assistant")}

    def rebuild(roles: list[str]) -> str:
        text = ""
        for i, r in enumerate(roles):
            m = markers[r]
            text += (m.first_prefix if i == 0 else m.prefix) + _SENTINELS[r] + m.suffix
        return text

    if (rebuild(["system", "user", "assistant"]) != full
            or rebuild(["user"]) != render(("user", None))
            or rebuild(["system", "user"]) + prefix["assistant"] != gen_prompt):
        log.warning("chat template not split into role markers: the rebuilt text differs")
        return {}
    return markers


def _drop_start(text: str, start: str) -> str:
    if not text.startswith(start):
        raise ValueError(f"{text!r} does not start with {start!r}")
    return text[len(start):]
