"""Text for an operator's terminal: stored values come from peers and users, so none is printed raw."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["terminal_text"]

# C0 and C1 controls and DEL (escape sequences, newlines that fake rows, carriage returns that overwrite them), the
# line and paragraph separators, and the bidirectional overrides and isolates that reorder what is shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def terminal_text(value: Any) -> str:
    r"""``str(value)`` with every control, separator and bidi-override character written as ``\uXXXX``.

    The escape is also a valid JSON string escape, so a JSON line stays valid JSON with the same value (those
    characters only ever occur inside JSON strings).
    """
    text = str(value)
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text
