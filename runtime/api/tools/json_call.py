"""`JsonCall`: one tool call written as JSON, scanned as its text streams in.

Either a call object, `{"name": "f", "arguments": {...}}` (keys in any order; Llama 3
writes `parameters`), or, given the name, a bare arguments object `{...}`. The scanner
tracks nesting and strings (with escapes) and the object's top-level keys, so it knows
where the name's value ends and which characters are the arguments' value, and hands
the arguments' text on as it goes. Runs of characters that cannot change its state
(inside a string, or nested inside a value) are skipped with one regex search, and the
state carries over between pieces: a piece costs time in its own length only.
"""

from __future__ import annotations

import json
import re

ARGUMENT_KEYS = ("arguments", "parameters")
_IN_STRING = re.compile(r'["\\]')  # what may end a run of string characters
_NESTED = re.compile(r'[{}\[\]"]')  # what changes the state inside a nested value
_SCALAR_END = re.compile(r"[,}]")
_SPACE = " \t\r\n"
# where the scanner is in the call object's top level
_KEY, _KEY_STR, _COLON, _VALUE, _VALUE_STR, _NESTED_VALUE, _SCALAR, _COMMA = range(8)


class JsonCall:
    """Scans one call's JSON: `feed` pieces until `done`. `name` is set once its value is
    complete; `arguments()` returns the arguments' text scanned since its last call;
    `result()` checks the whole once done. `failed`: the text is not a call object.

    `name` given: the text is the arguments object itself (the name came from elsewhere).
    """

    def __init__(self, name: str | None = None) -> None:
        self.bare = name is not None
        self.name = name
        self.done = False
        self.failed = False
        self._raw: list[str] = []
        self._pending: list[str] = []  # arguments' text not yet handed on
        self._args: list[str] = []  # all of the arguments' text
        self._args_seen = False
        self._name_parts: list[str] = []
        self._key_parts: list[str] = []
        self._key = ""
        self._depth = 0
        self._in_str = False
        self._esc = False
        self._state = _KEY
        self._capture: str | None = None  # "name" or "args": the value being captured
        self._cap_start = 0

    @property
    def raw(self) -> str:
        """The text consumed so far."""
        return "".join(self._raw)

    def arguments(self) -> str:
        """The arguments' text scanned since the last call."""
        out = "".join(self._pending)
        self._pending.clear()
        return out

    def feed(self, text: str) -> int:
        """Scan `text`; return how much of it belongs to this call: all of it, unless the
        call ended (or turned out not to be a call object) inside it."""
        i, n = 0, len(text)
        self._cap_start = 0
        while i < n and not self.done:
            i = self._step(text, i)
        self._flush(text, i)
        self._raw.append(text[:i])
        return i

    def result(self) -> tuple[str, str] | None:
        """(name, arguments JSON text) of a finished, well-formed call, else None."""
        if not self.done or self.failed or not self.name:
            return None
        arguments = "".join(self._args) if self._args_seen else "{}"
        try:
            whole, args = json.loads(self.raw), json.loads(arguments)
        except ValueError:
            return None
        if not isinstance(whole, dict) or not isinstance(args, dict):
            return None
        return self.name, arguments

    # ------------------------------------------------------------ scanning
    def _step(self, text: str, i: int) -> int:
        """Advance over one character, or over a run of characters that change nothing."""
        if self._in_str:
            return self._string(text, i)
        if self._depth == 0:
            return self._open(text, i)
        if self.bare or self._depth > 1:
            m = _NESTED.search(text, i)
            if m is None:
                return len(text)
            j, ch = m.start(), m.group()
            if ch == '"':
                self._in_str = True
            elif ch in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth == 0:  # a bare arguments object ended
                    self._end_value(text, j + 1)
                    self.done = True
                elif self._depth == 1 and not self.bare:
                    self._end_value(text, j + 1)
            return j + 1
        return self._top(text, i)

    def _string(self, text: str, i: int) -> int:
        if self._esc:
            self._esc = False
            if self._state == _KEY_STR:
                self._key_parts.append(text[i])
            return i + 1
        m = _IN_STRING.search(text, i)
        j = len(text) if m is None else m.start()
        key = self._state == _KEY_STR and self._depth == 1
        if key:
            self._key_parts.append(text[i:j + 1 if m is not None and m.group() == "\\" else j])
        if m is None:
            return j
        if m.group() == "\\":
            self._esc = True
            return j + 1
        self._in_str = False
        if self._depth == 1 and not self.bare:
            if key:
                self._key = _decode_key("".join(self._key_parts))
                self._state = _COLON
            elif self._state == _VALUE_STR:
                self._end_value(text, j + 1)
        return j + 1

    def _open(self, text: str, i: int) -> int:
        """Before the object: whitespace, then its `{`; anything else is no call."""
        while i < len(text) and text[i] in _SPACE:
            i += 1
        if i < len(text):
            if text[i] != "{":
                self.done = self.failed = True
                return i
            self._depth = 1
            if self.bare:
                self._args_seen = True
                self._capture, self._cap_start = "args", i
            return i + 1
        return i

    def _top(self, text: str, i: int) -> int:
        """One character (or a scalar's run) of the call object's top level."""
        state, ch = self._state, text[i]
        if state == _SCALAR:  # a number or literal runs to the next `,` or `}`
            m = _SCALAR_END.search(text, i)
            if m is None:
                return len(text)
            self._end_value(text, m.start())
            return m.start()  # the delimiter is read again, after the value
        if ch in _SPACE:
            return i + 1
        if state == _KEY and ch == '"':
            self._in_str, self._state, self._key_parts = True, _KEY_STR, []
        elif state == _COLON and ch == ":":
            self._state = _VALUE
        elif state == _VALUE:
            self._begin_value(i)
            if ch == '"':
                self._in_str, self._state = True, _VALUE_STR
            elif ch in "{[":
                self._depth, self._state = 2, _NESTED_VALUE
            else:
                self._state = _SCALAR
                return i
        elif state in (_KEY, _COMMA) and ch == "}":
            self._depth = 0
            self.done = True
        elif state == _COMMA and ch == ",":
            self._state = _KEY
        else:  # not a call object: it ends here, with what was read
            self.done = self.failed = True
            return i
        return i + 1

    # ------------------------------------------------------------ capturing values
    def _begin_value(self, i: int) -> None:
        if self._key == "name" and self.name is None and not self._name_parts:
            self._capture = "name"
        elif self._key in ARGUMENT_KEYS and not self._args_seen:
            self._args_seen = True
            self._capture = "args"
        else:
            self._capture = None
        self._cap_start = i

    def _end_value(self, text: str, end: int) -> None:
        self._flush(text, end)
        if self._capture == "name":
            try:
                name = json.loads("".join(self._name_parts))
            except ValueError:
                name = None
            self.name = name if isinstance(name, str) else ""
        self._capture = None
        self._state = _COMMA

    def _flush(self, text: str, end: int) -> None:
        """Hand the captured value's characters up to `end` on."""
        if self._capture is None or end <= self._cap_start:
            return
        piece = text[self._cap_start:end]
        if self._capture == "name":
            self._name_parts.append(piece)
        else:
            self._pending.append(piece)
            self._args.append(piece)
        self._cap_start = end


def _decode_key(text: str) -> str:
    try:
        return json.loads(f'"{text}"')
    except ValueError:
        return text
