"""Peer routing functions of the seed-compatible facade (filled in by the peers work)."""

__all__: list[str] = []
