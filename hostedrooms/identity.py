"""The local gateway's identity: injected explicitly, else read from the install's environment."""

from __future__ import annotations

import os
from typing import Any

from .errors import HostedRoomError, InvalidInputError
from .validation import identifier

#: Environment variable holding this install's stable id; the gateway id is ``install:<id>``.
INSTALL_ID_ENV = "HOSTEDROOMS_INSTALL_ID"


def local_gateway_id(explicit: Any = None) -> str:
    """The local authority gateway id: ``explicit`` if given, else ``install:$HOSTEDROOMS_INSTALL_ID``.

    ``explicit`` may also be a zero-argument callable returning the id; it is called here, so a service that
    resolves its identity after validating its arguments looks the provider up no earlier than the reference
    did (the replicas facade passes its module's ``local_authority_gateway_id`` this way).
    """
    if callable(explicit):
        return identifier(explicit(), error=InvalidInputError, label="authority_gateway_id")
    if explicit is not None:
        return identifier(explicit, error=InvalidInputError, label="authority_gateway_id")
    install_id = os.environ.get(INSTALL_ID_ENV, "").strip()
    if not install_id:
        raise HostedRoomError("stable gateway install identity is unavailable")
    return identifier(f"install:{install_id}", error=HostedRoomError, label="authority_gateway_id")
