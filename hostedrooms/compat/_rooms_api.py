"""Room and event functions of the seed-compatible facade (filled in by the rooms work)."""

__all__: list[str] = []
