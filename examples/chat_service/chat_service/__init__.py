"""A small chat service on hostedrooms: rooms, idempotent appends, pages, a live SSE stream and one outbound call
through the ledger (see README.md)."""

from .app import Sender, create_app, from_environment, http_sender

__all__ = ["Sender", "create_app", "from_environment", "http_sender"]
