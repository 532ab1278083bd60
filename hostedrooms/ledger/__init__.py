"""Secure-peer delivery ledger: a crash-safe state machine from a relay envelope to one local chat turn.

The authoritative exchange lives on the designated Hub; this ledger bridges that remote transaction to one
durable local turn. A delivery is *prepared* (its immutable claim is stored and committed) before it is
acknowledged remotely, so a process that dies between the remote compare-and-swap and local admission
resumes the saved intent on restart (:meth:`DeliveryLedger.recoverable`) instead of losing or re-running it.

Delivery states: ``prepared`` -> ``authorized`` -> ``queued`` -> ``running`` -> ``completed``/``failed``.
Each transition is one guarded ``UPDATE ... WHERE state IN (...)``; a transition that lost its race changes
nothing. Response intents (a reply owed to the Hub) and outbound intents (a request this side sends) are
bound to a SHA-256 digest before they leave, and retried with :func:`retry_delay` backoff.

When the ledger is a SQLite file it is owner-private: its directory is ``0700`` (a shared directory, such as
``/tmp``, is refused, never changed); the file must be a regular ``0600`` file owned by this user with a single
link, and before every transaction its path is checked with ``os.lstat`` to still name that same file (the
reference reconnects, and re-checks, for every operation). The file is never opened for these checks: closing
any descriptor of it would release this process's SQLite locks (see :mod:`hostedrooms.files`). Commits must be
crash-safe (WAL with ``synchronous=FULL``). Timestamps are integer seconds: ``int(clock())``.

Layout: :mod:`.claims` (pure: claim builders, digests, validators), :mod:`.guard` (the owner-private file),
:mod:`hostedrooms.store.ledger` (every statement of the ledger and the delivery states; a unit reaches it as
``uow.ledger``), :mod:`.rows` (decoding rows), :mod:`.base` (clock, file checks, one transaction per call),
:mod:`.retries` (the retry/fail machine), :mod:`.deliveries`, :mod:`.responses`, :mod:`.outbound` and
:mod:`.retention` (the service's parts, holding the rules), and :mod:`.service` (:class:`DeliveryLedger`, composed
of them); :func:`observe_ledger` (the backlog gauge) comes from :mod:`hostedrooms.telemetry`.
"""

from __future__ import annotations

from ..files import ensure_private_directory
from ..store.ledger import (
    ACTIVE_DELIVERY_STATES,
    DELIVERY_STATES,
    NONTERMINAL_DELIVERY_STATES,
    TERMINAL_DELIVERY_STATES,
)
from ..store.ledger import EXPIRED_ERROR as EXPIRED_ERROR
from ..store.ledger import PREPARE_LOCK_KEY as PREPARE_LOCK_KEY
from ..telemetry import observe_ledger
from .base import Clock as Clock
from .claims import ACTIONS as ACTIONS
from .claims import DEFAULT_RETAIN_SECONDS as DEFAULT_RETAIN_SECONDS
from .claims import FINISH_ERROR_CUT_MARK as FINISH_ERROR_CUT_MARK
from .claims import KINDS as KINDS
from .claims import MAX_ERROR_CHARS as MAX_ERROR_CHARS
from .claims import MAX_FINISH_ERROR_CHARS as MAX_FINISH_ERROR_CHARS
from .claims import MAX_LEGS as MAX_LEGS
from .claims import MAX_MESSAGE_CHARS as MAX_MESSAGE_CHARS
from .claims import MAX_RETRY_BATCH as MAX_RETRY_BATCH
from .claims import RETRY_CEILING_SECONDS as RETRY_CEILING_SECONDS
from .claims import RETRY_EXPONENT_CAP as RETRY_EXPONENT_CAP
from .claims import ROLES as ROLES
from .claims import delivery_claim as delivery_claim
from .claims import outbound_claim as outbound_claim
from .claims import retry_delay
from .guard import FileIdentity as FileIdentity
from .guard import prepare_ledger_file, secure_ledger_file
from .service import DeliveryLedger

# Names imported "as" themselves are importable from here but are not part of __all__.
__all__ = [
    "ACTIVE_DELIVERY_STATES",
    "DELIVERY_STATES",
    "NONTERMINAL_DELIVERY_STATES",
    "TERMINAL_DELIVERY_STATES",
    "DeliveryLedger",
    "ensure_private_directory",
    "observe_ledger",
    "prepare_ledger_file",
    "retry_delay",
    "secure_ledger_file",
]
