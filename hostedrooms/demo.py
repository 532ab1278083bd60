"""The failover demo (gateway A hosts, B replicates and takes over, A demotes itself)."""

from __future__ import annotations

from typing import TextIO

from .errors import HostedRoomError


def run_demo(*, directory: str | None, url_a: str | None, url_b: str | None, out: TextIO) -> int:
    """Run the demo; returns the process exit code."""
    raise HostedRoomError("the demo needs the replicas module, which is not built yet")
