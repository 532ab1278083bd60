"""Named step boundaries of a takeover, for tests that interleave gateways (:func:`step`, :func:`step_hook`).

The replicator and failover call :func:`step` between the steps whose order matters: after a demotion proof and
before the demoting write, after a failover's plan and before its fences, after the fences and before the
catch-up, before and after each promotion. In production nothing is installed and a step costs one global read.
A test installs a hook with :func:`step_hook`; the hook is called in the thread that reached the step, with the
step's name and details (``room_id``, ``gateway``), and may block it until the test lets it go on, or raise to
model a process killed there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["StepHook", "step", "step_hook"]

#: A hook: called with the step's name and its details.
StepHook = Callable[[str, Mapping[str, Any]], None]

_hook: StepHook | None = None


def step(name: str, **details: Any) -> None:
    """Mark a step boundary: call the installed hook, if any (test-only; nothing is installed otherwise)."""
    hook = _hook
    if hook is not None:
        hook(name, details)


@contextmanager
def step_hook(hook: StepHook) -> Iterator[None]:
    """Install ``hook`` for every thread of this process until the block ends (tests only; not reentrant)."""
    global _hook
    previous, _hook = _hook, hook
    try:
        yield
    finally:
        _hook = previous
