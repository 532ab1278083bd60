"""Drop-in replacement for the reference ``gateway.hosted_rooms`` module.

Switch with one import change (``from hostedrooms.compat import hosted_rooms``); ``db_path`` may be a
SQLite file path, a SQLAlchemy URL string, or an Engine. The ``MAX_*`` limits below are read at call time,
so lowering one on this module (as the reference's own tests do) takes effect.

Other names of the reference module's namespace are here too, for code that reads or patches them
(docs/migrating.md, "Migrating from the reference implementation"): ``time`` is the standard module (patching
``hosted_rooms.time.time`` moves the clock of every call made without ``now=``, as in the reference),
``request_room_stop`` goes through this module's ``append_event`` looked up at call time, and the helpers
``identifier``, ``bounded_int``, ``canonical_json``, ``compact_json`` and ``utf8_len`` keep the reference's
contracts.
"""

from __future__ import annotations

import time  # noqa: F401  # the reference module's name, see above

from ..validation import bounded_int, canonical_json, compact_json, identifier, utf8_len  # noqa: F401

# Links, revoked grants, peer reservations, remote-run receipts, probes (issue: peer routing state).
from ._peers_api import *  # noqa: F403

# Room and event functions, limits and exceptions (issue: rooms and the event log).
from ._rooms_api import *  # noqa: F403
