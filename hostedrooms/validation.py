"""Pure input validation with the reference implementation's rules and messages (no database here).

Every public operation validates all of its arguments with these helpers before a transaction opens,
so bad input never touches the database.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Callable
from json.encoder import (  # type: ignore[attr-defined]  # the C accelerator is not in the stubs
    c_make_encoder,
    encode_basestring,
    encode_basestring_ascii,
)
from json.scanner import make_scanner
from typing import Any

from . import limits
from .errors import InvalidInputError, StorageError

ErrorFactory = Callable[[str], Exception]


def refusal(error: ErrorFactory, message: str, field: str | None) -> Exception:
    """``error(message)``, naming ``field`` when it is an :class:`InvalidInputError` that names none yet."""
    exc = error(message)
    if isinstance(exc, InvalidInputError) and exc.field is None:
        exc.field = field
    return exc

#: The largest integer both backends store (64-bit signed): counters, epochs and offsets are bounded by it.
INT64_MAX = 2**63 - 1
#: The largest authority epoch stored anywhere: a claim or promotion writes ``epoch + 1``, which must still fit.
MAX_EPOCH = INT64_MAX - 1

#: Identifier shape: an ASCII letter or digit, then letters, digits, ``.``, ``_``, ``:`` or ``-``.
IDENTIFIER_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_DEFAULT_PATTERN: Any = object()
_IDENTIFIER_MATCH = IDENTIFIER_PATTERN.fullmatch


def identifier(
    value: Any,
    *,
    error: ErrorFactory,
    label: str,
    max_chars: int = 128,
    pattern: re.Pattern[str] | None = _DEFAULT_PATTERN,
    invalid: str | None = None,
) -> str:
    """Return ``value`` stripped, or raise ``error``.

    A non-string is ``"<label> must be a string"``; an empty, over-long or misshapen value is ``invalid``
    (default ``"invalid <label>"``). ``pattern=None`` checks only emptiness and length (free text).
    """
    if (pattern is _DEFAULT_PATTERN and type(value) is str and len(value) <= max_chars
            and _IDENTIFIER_MATCH(value) is not None):
        return value  # the common case: already stripped (no spaces in the shape) and ASCII
    if not isinstance(value, str):
        raise refusal(error, f"{label} must be a string", label)
    text = value.strip()
    shape = IDENTIFIER_PATTERN if pattern is _DEFAULT_PATTERN else pattern
    if (not text or len(text) > max_chars or (shape is not None and shape.fullmatch(text) is None)
            or not storable_text(text)):
        raise refusal(error, invalid if invalid is not None else f"invalid {label}", label)
    return text


def flag(value: Any, label: str) -> bool:
    """``value`` if it is a bool, else :class:`InvalidInputError` naming ``label``."""
    if not isinstance(value, bool):
        raise InvalidInputError(f"{label} must be True or False", field=label)
    return value


#: The longest interval a waiter takes (seconds): a day (longer overflows some platforms' waits).
MAX_INTERVAL_SECONDS = 86_400.0


def interval(value: Any, label: str) -> float:
    """``value`` as seconds if it is a finite number above 0 and at most a day, else :class:`InvalidInputError`
    naming ``label``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0 < value <= MAX_INTERVAL_SECONDS):
        raise InvalidInputError(f"{label} must be a number of seconds above 0 and at most {MAX_INTERVAL_SECONDS:g}",
                                field=label)
    return float(value)


def _utf8(text: str) -> bool:
    """Whether ``text`` can be stored as UTF-8 (a lone surrogate cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable_text(text: str) -> bool:
    """Whether ``text`` can reach a text column of both backends unchanged.

    PostgreSQL refuses NUL characters in text (SQLite stores them) and neither driver can encode a lone
    surrogate, so both are refused everywhere, before any transaction opens. (JSON documents are not affected:
    their encoder escapes NUL as ``\\u0000``.)
    """
    return "\x00" not in text and (text.isascii() or _utf8(text))


def storable_string(value: Any, *, error: ErrorFactory, label: str) -> str:
    """``value`` if it is a string both backends can store and compare (:func:`storable_text`), else
    ``error("<label> must be a string")`` or ``error("<label> must not contain NUL characters or lone
    surrogates")``. The message never quotes the value (it may be a secret)."""
    if not isinstance(value, str):
        raise refusal(error, f"{label} must be a string", label)
    if not storable_text(value):
        raise refusal(error, f"{label} must not contain NUL characters or lone surrogates", label)
    return value


def storable_copy(text: str) -> str:
    """``text`` with NUL and lone surrogates replaced by backslash escapes, for free text that is recorded
    rather than validated (a caller's own error message)."""
    if storable_text(text):
        return text
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def bounded_int(
    value: Any, *, error: ErrorFactory, message: str, low: int = 0, high: int | None = None, field: str | None = None
) -> int:
    """Return ``value`` if it is an ``int`` (never a ``bool``) within ``[low, high]``, else raise ``error(message)``
    (naming ``field``, see :func:`refusal`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise refusal(error, message, field)
    return value


def _not_serializable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _compact_encoder(ensure_ascii: bool) -> Callable[[Any], str]:
    """``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=...)``, built once.

    json.dumps() with options builds a new encoder on every call, and JSONEncoder.encode() a new C encoder:
    together most of the cost of validating a small event. The C encoder is made once here instead (without the
    circular-reference guard: a cycle still fails, as RecursionError, which callers treat as not serializable).
    """
    if c_make_encoder is None:  # pragma: no cover - CPython always has the C accelerator
        encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False)
        return encoder.encode
    strings = encode_basestring_ascii if ensure_ascii else encode_basestring
    # allow_nan=False: NaN and Infinity are not JSON; other parsers (and PostgreSQL's json types) refuse them.
    make = c_make_encoder(None, _not_serializable, strings, None, ":", ",", True, False, False)

    def encode(value: Any) -> str:
        if isinstance(value, str):
            return str(strings(value))
        return "".join(make(value, 0))

    return encode


_COMPACT = {ascii_only: _compact_encoder(ascii_only) for ascii_only in (True, False)}
# The stored texts' encoder of a dict (non-ASCII kept), called straight: what _COMPACT[False] runs for one, without
# its wrapper. (CPython always has the C accelerator; without it, the wrapper.)
_ENCODE_OBJECT: Callable[[Any, int], Any] | None = (
    None if c_make_encoder is None
    else c_make_encoder(None, _not_serializable, encode_basestring, None, ":", ",", True, False, False))
_DIGEST = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def compact_json(value: Any, *, ensure_ascii: bool = True) -> str:
    """Sorted keys and ``,``/``:`` separators, NaN and Infinity refused; the json module's own errors propagate."""
    return _COMPACT[ensure_ascii](value)


# Everything JSON allows outside strings is ASCII: keep the brackets (as one kind: nesting depth does not depend
# on it), delete the rest.
_SKELETON = {code: None for code in range(128)} | {ord("["): "[", ord("{"): "[", ord("]"): "]", ord("}"): "]"}


def json_depth_within(text: str, limit: int) -> bool:
    """Whether the arrays and objects of the JSON ``text`` nest at most ``limit`` deep (the outermost is 1).

    Decided on the text, which is what is stored (a hostile Mapping may show the encoder one structure and a
    walker another). The common case is a count: a text with at most ``limit`` opening brackets cannot nest
    deeper. Otherwise the text is reduced to its brackets outside strings (escaped backslashes, then escaped
    quotes, are dropped, so every remaining quote delimits a string), and each pass deletes the innermost empty
    pairs: ``str.replace`` does not rescan what it rewrote, so a pass removes exactly one level, and at most
    ``limit`` linear passes decide it.
    """
    if text.count("[") + text.count("{") <= limit:
        return True
    unescaped = text.replace("\\\\", "").replace('\\"', "") if "\\" in text else text
    skeleton = "".join(unescaped.split('"')[::2]).translate(_SKELETON)
    for _ in range(limit):
        if not skeleton:
            return True
        skeleton = skeleton.replace("[]", "")
    return not skeleton


def max_json_depth() -> int:
    """:data:`hostedrooms.limits.MAX_JSON_DEPTH`, read at call time."""
    return int(limits.MAX_JSON_DEPTH)


def canonical_json(value: Any, *, error: ErrorFactory, label: str, max_bytes: int, ensure_ascii: bool = False) -> str:
    """The canonical text stored for actors, payloads and members, bounded to ``max_bytes`` UTF-8 bytes."""
    return canonical_json_sized(value, error=error, label=label, max_bytes=max_bytes, ensure_ascii=ensure_ascii)[0]


def canonical_json_sized(
    value: Any, *, error: ErrorFactory, label: str, max_bytes: int, ensure_ascii: bool = False
) -> tuple[str, int]:
    """:func:`canonical_json` and its UTF-8 size; at most ``MAX_JSON_DEPTH`` deep, no NaN or Infinity."""
    try:
        text = _COMPACT[ensure_ascii](value)
        # (utf8_len, inlined: this runs for every event.) A lone surrogate serialises but cannot be encoded
        # (UnicodeEncodeError).
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise refusal(error, f"{label} must be JSON-serializable", label) from exc
    if size > max_bytes:
        raise refusal(error, f"{label} is too large", label)
    # Nesting d deep takes 2d characters at least: a short text (most events) needs no look.
    depth = limits.MAX_JSON_DEPTH
    if len(text) > 2 * depth and not json_depth_within(text, depth):
        raise refusal(error, f"{label} is nested too deeply", label)
    return text, size


def canonical_object(value: dict[Any, Any], max_bytes: int) -> tuple[str, int] | None:
    """:func:`canonical_json_sized`'s text and size for a ``dict`` that passes it (non-ASCII kept), else None: the
    caller then calls :func:`canonical_json_sized`, which raises the error. The same encoder and the same checks,
    with none of the per-call set-up (a batch append runs this once per item)."""
    if _ENCODE_OBJECT is None:  # pragma: no cover - CPython always has the C accelerator
        return None
    try:
        text = "".join(_ENCODE_OBJECT(value, 0))
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (TypeError, ValueError, RecursionError):
        return None
    depth = limits.MAX_JSON_DEPTH
    if size > max_bytes or (len(text) > 2 * depth and not json_depth_within(text, depth)):
        return None
    return text, size


def canonical_json_bytes(value: Any) -> bytes:
    """UTF-8 canonical JSON for digests: sorted keys, compact, non-ASCII kept, NaN/Infinity refused."""
    return _DIGEST.encode(value).encode("utf-8")


def utf8_len(*parts: str) -> int:
    """Total UTF-8 byte length: the event byte accounting is event_id + kind + actor_json + payload_json."""
    total = 0
    for part in parts:
        total += len(part) if part.isascii() else len(part.encode("utf-8"))
    return total


def clock(now: float | None) -> float:
    """``time.time()`` read at call time when ``now`` is None, else ``float(now)`` (finite, or InvalidInputError)."""
    if now is None:
        return time.time()
    try:
        value = float(now)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError("now must be a number", field="now") from exc
    if not math.isfinite(value):
        raise InvalidInputError("now must be a finite number", field="now")
    return value


# json.loads(text) of a str runs the json module's scanner at index 0, inside a wrapper (a BOM check, whitespace
# skipped before and after): calling the scanner directly costs a third of json.loads for a small text.
_DECODER: Any = json.JSONDecoder()  # (the stubs type make_scanner's argument oddly)
_SCAN: Callable[[str, int], tuple[Any, int]] = make_scanner(_DECODER)


def surely_shallow(text: str) -> bool:
    """Whether the JSON ``text`` nests at most a quarter of the recursion limit deep, so that decoding it (and
    writing it back) never comes near the limit, a few frames deeper or shallower: a fast path that decodes at
    another stack depth than json.loads then fails or succeeds exactly as json.loads would."""
    depth = sys.getrecursionlimit() >> 2
    return (len(text) <= 2 * depth or text.count("[") + text.count("{") <= depth
            or json_depth_within(text, depth))


def decode_json(text: Any) -> Any:
    """``json.loads(text)``, the same value or the same error, faster for a str that holds one JSON value and
    nothing else (whitespace around it, bytes, a deep text or an invalid one go through json.loads itself)."""
    if type(text) is str and surely_shallow(text):
        try:
            value, end = _SCAN(text, 0)
        except Exception:  # json.loads raises its own error for it
            return json.loads(text)
        if end == len(text):
            return value
    return json.loads(text)


def stored_json(text: Any, where: Callable[[], str]) -> Any:
    """Decode a JSON column read back from the store.

    Whatever hostedrooms writes decodes (it is bounded to MAX_JSON_DEPTH), but rows written by the reference, by
    older versions or by hand may not: a text that is not JSON, or nests deeper than the interpreter can decode
    (RecursionError), raises :class:`StorageError` naming ``where()`` (for example the room and seq), never a raw
    parser error. The recursion limit is never raised for this: deep enough JSON would overflow the C stack.
    """
    try:
        return decode_json(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise StorageError(f"{where()} holds a stored value that cannot be decoded ({type(exc).__name__})") from exc
