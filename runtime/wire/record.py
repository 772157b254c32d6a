"""The base of every record that crosses a socket.

Records are array-like on the wire, tagged by their class name (a channel's union decodes
by the tag, so a record's class name is part of the protocol): new fields are only ever
appended, with defaults.
"""

from __future__ import annotations

import msgspec


class WireRecord(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    """A record of the wire protocol; subclasses inherit its encoding options."""
