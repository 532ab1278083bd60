"""Who may read the page endpoint: a shared bearer token, and TLS through the standard library's :mod:`ssl`.

The page endpoint (:class:`~hostedrooms.standby.server.PageServer`, ``hostedrooms serve-pages``) lets its reader
copy every room, and a log it serves is what a returning authority's replicator reads to demote itself. So it
answers only a client presenting the shared token (``Authorization: Bearer TOKEN``), compared in constant time,
and it refuses to listen beyond loopback without one. Without the token every request gets the same small 401,
whatever its path, naming no room.

The token is a value (``str`` or ``bytes``: 16 to 1024 visible ASCII characters, no spaces), held in a
:class:`PageToken` whose ``repr`` and ``str`` never show it. Operators give it in a file (:func:`read_token_file`:
one line, the trailing newline dropped, refused when others may read it or group or others may write it) or in
``$HOSTEDROOMS_PAGE_TOKEN`` (:func:`token_from_env`), never on a command line (which other local users can read
in the process list).

What the token does not do: a reader that holds it (a configured standby, or a source that is itself
compromised) reads every room, and a source can still serve the authority's genuine pages followed by a forged
``authority.claimed`` and so demote a returning authority. Closing that needs claims signed by gateway keys.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import ssl
import stat
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..errors import HostedRoomError, InvalidInputError

__all__ = [
    "TOKEN_ENV",
    "PageToken",
    "client_tls_context",
    "in_clear",
    "is_loopback",
    "page_token",
    "read_token_file",
    "resolve_token",
    "server_tls_context",
    "token_from_env",
]

#: The environment variable holding the page endpoint's token (server and client).
TOKEN_ENV = "HOSTEDROOMS_PAGE_TOKEN"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 1024
#: The most a token file is read of (a longer file is refused, not cut).
_MAX_FILE_BYTES = MAX_TOKEN_CHARS + 2


class PageToken:
    """A checked bearer token. Its ``repr``/``str`` never show the value; :meth:`matches` compares in constant
    time (SHA-256 digests of both sides through :func:`hmac.compare_digest`, so not even the length leaks).

    :param value: the token, as str or bytes.
    :raises InvalidInputError: ``value`` is not a token (its length or characters).
    """

    __slots__ = ("_digest", "_value")

    def __init__(self, value: str | bytes) -> None:
        self._value = _checked(value)
        self._digest = hashlib.sha256(self._value).digest()

    def header(self) -> str:
        """The ``Authorization`` header's value.

        :returns: ``Bearer`` and the token.
        """
        return "Bearer " + self._value.decode("ascii")

    def matches(self, presented: bytes) -> bool:
        """Whether ``presented`` is the token (constant time).

        :param presented: the token a client presented.
        :returns: True when it is this token.
        """
        return hmac.compare_digest(hashlib.sha256(presented).digest(), self._digest)

    def __repr__(self) -> str:
        return "PageToken(<redacted>)"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a PageToken is not pickled (it would carry the secret)")


def _checked(value: Any) -> bytes:
    if isinstance(value, str):
        if not value.isascii():
            raise InvalidInputError("the page token must be visible ASCII characters", field="token")
        raw = value.encode("ascii")
    elif isinstance(value, bytes):
        raw = value
    else:
        raise InvalidInputError(f"the page token must be str or bytes, not {type(value).__name__}", field="token")
    if not MIN_TOKEN_CHARS <= len(raw) <= MAX_TOKEN_CHARS:
        raise InvalidInputError(f"the page token must be {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} characters "
                                f"(it has {len(raw)})", field="token")
    if any(byte < 0x21 or byte > 0x7E for byte in raw):
        raise InvalidInputError("the page token must be visible ASCII characters (no spaces, line breaks or "
                                "control characters)", field="token")
    return raw


def page_token(value: PageToken | str | bytes | None) -> PageToken | None:
    """``value`` as a :class:`PageToken` (None stays None); InvalidInputError (``field="token"``) when invalid.
    The message never quotes the value."""
    if value is None or isinstance(value, PageToken):
        return value
    return PageToken(value)


def read_token_file(path: str | os.PathLike[str]) -> PageToken:
    """The token in the file at ``path``: its one line, one trailing newline (``\\n`` or ``\\r\\n``) dropped.

    Refused (InvalidInputError, ``field="token_file"``, the contents never quoted) when it cannot be read, is
    longer than a token can be, holds anything else, or when others may read it or group or others may write it
    (``chmod 600``, or ``640`` for a group the service runs in).

    :param path: the token file.
    :returns: the token.
    :raises InvalidInputError: the file cannot be read, is open to others or does not hold one token.
    """
    try:
        with open(path, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            content = handle.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InvalidInputError(f"cannot read the token file {os.fspath(path)!r}: {type(exc).__name__}",
                                field="token_file") from None
    if stat.S_ISREG(mode) and mode & (stat.S_IRWXO | stat.S_IWGRP):
        raise InvalidInputError(f"the token file {os.fspath(path)!r} is open to others (mode "
                                f"{stat.S_IMODE(mode):04o}): chmod 600 it (640 to share it with a group)",
                                field="token_file")
    if len(content) > _MAX_FILE_BYTES:
        raise InvalidInputError(f"the token file {os.fspath(path)!r} is longer than a token can be",
                                field="token_file")
    content = content.removesuffix(b"\n").removesuffix(b"\r")
    try:
        return PageToken(content)
    except InvalidInputError as exc:
        raise InvalidInputError(f"the token file {os.fspath(path)!r} does not hold one token: {exc}",
                                field="token_file") from None


def token_from_env(environ: Mapping[str, str] | None = None) -> PageToken | None:
    """The token in ``$HOSTEDROOMS_PAGE_TOKEN`` (None when unset or empty).

    :param environ: the environment to read (default: :data:`os.environ`).
    :returns: the token, or None.
    :raises InvalidInputError: the variable holds something that is not a token.
    """
    value = (os.environ if environ is None else environ).get(TOKEN_ENV)
    if not value:
        return None
    try:
        return PageToken(value)
    except InvalidInputError as exc:
        raise InvalidInputError(f"${TOKEN_ENV} does not hold a token: {exc}", field="token") from None


def resolve_token(token_file: str | os.PathLike[str] | None,
                  environ: Mapping[str, str] | None = None) -> PageToken | None:
    """The command line's token: the file when one is named, else ``$HOSTEDROOMS_PAGE_TOKEN``, else None."""
    if token_file is not None:
        return read_token_file(token_file)
    return token_from_env(environ)


def authorization_matches(token: PageToken, values: list[str] | None) -> bool:
    """Whether a request's ``Authorization`` headers (all of them) are exactly one ``Bearer`` with ``token``."""
    if not values or len(values) != 1:
        return False
    scheme, _, presented = values[0].strip().partition(" ")
    # Compared even when the scheme is wrong, so a refusal takes the same path whatever was sent.
    matched = token.matches(presented.strip().encode("latin-1", "replace"))
    return matched and scheme.lower() == "bearer"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address as bound: ``server_address[0]``) is a loopback address."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def in_clear(url: str) -> bool:
    """Whether ``url`` is plain ``http://`` to a host that is not loopback (``localhost`` counts as loopback):
    a token sent there, and the pages, cross a network unencrypted."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    return parts.scheme == "http" and host != "localhost" and not is_loopback(host)


def server_tls_context(cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]) -> ssl.SSLContext:
    """A server context (TLS 1.2 at least) with the certificate chain in ``cert_file`` and its key in
    ``key_file`` (PEM). A file that cannot be loaded raises HostedRoomError naming it.

    :param cert_file: the PEM certificate chain.
    :param key_file: its PEM private key.
    :returns: the context, for :class:`~hostedrooms.standby.PageServer`.
    :raises HostedRoomError: a path is invalid, or the files cannot be loaded.
    """
    for label, value in (("cert_file", cert_file), ("key_file", key_file)):
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise HostedRoomError(f"{label} must be a file path (a non-empty string or os.PathLike)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise HostedRoomError(f"cannot load the TLS certificate {os.fspath(cert_file)!r} and key "
                              f"{os.fspath(key_file)!r}: {type(exc).__name__}: {exc}") from None
    return context


def client_tls_context(ca_file: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """A client context verifying the server's certificate and host name (TLS 1.2 at least): against the
    system's CAs, or only the CA certificates in ``ca_file`` (PEM) when given.

    :param ca_file: a PEM file of the CA certificates to trust, or None for the system's.
    :returns: the context, for :class:`~hostedrooms.standby.HttpPageSource`.
    :raises HostedRoomError: ``ca_file`` is not a path or cannot be loaded.
    """
    if ca_file is not None and (not isinstance(ca_file, (str, os.PathLike)) or not os.fspath(ca_file)):
        raise HostedRoomError("ca_file must be None or a file path (a non-empty string or os.PathLike)")
    try:
        context = ssl.create_default_context(cafile=None if ca_file is None else os.fspath(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise HostedRoomError(f"cannot load the TLS CA file {os.fspath(ca_file or '')!r}: "
                              f"{type(exc).__name__}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
