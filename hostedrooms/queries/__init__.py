"""The read side: read-only reporting queries outside the stores, each run on its caller's connection."""
