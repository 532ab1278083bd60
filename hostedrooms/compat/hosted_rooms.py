"""Drop-in replacement for the reference ``gateway.hosted_rooms`` module.

Switch with one import change (``from hostedrooms.compat import hosted_rooms``); ``db_path`` may be a
SQLite file path, a SQLAlchemy URL string, or an Engine. The ``MAX_*`` limits below are read at call time,
so lowering one on this module (as the reference's own tests do) takes effect.
"""

from __future__ import annotations

# Links, revoked grants, peer reservations, remote-run receipts, probes (issue: peer routing state).
from ._peers_api import *  # noqa: F403

# Room and event functions, limits and exceptions (issue: rooms and the event log).
from ._rooms_api import *  # noqa: F403
