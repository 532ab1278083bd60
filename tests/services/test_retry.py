"""hostedrooms.retry: jittered exponential back-off and retry(), with the clock and randomness injected."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from hostedrooms.errors import (
    CapacityExceededError,
    InvalidInputError,
    StorageError,
    StoreUnavailableError,
)
from hostedrooms.retry import JitteredBackoff, RetryArgumentError, retry


def _fixed(value: float) -> Callable[[], float]:
    return lambda: value


def _failing(errors: list[BaseException], result: Any = "done") -> tuple[Callable[[], Any], list[int]]:
    """A call raising ``errors`` in turn, then returning ``result``; and the list counting its calls."""
    calls: list[int] = []

    def call() -> Any:
        calls.append(len(calls) + 1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return result

    return call, calls


# --- the delays ------------------------------------------------------------------------------------------------


def test_ceilings_double_from_base_up_to_cap() -> None:
    backoff = JitteredBackoff(base=0.5, cap=6.0, jitter="none")
    assert [backoff.ceiling(attempt) for attempt in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 6.0, 6.0]
    assert list(itertools.islice(backoff, 6)) == [0.5, 1.0, 2.0, 4.0, 6.0, 6.0]
    assert backoff.ceiling(10_000) == 6.0  # no overflow far out


@pytest.mark.parametrize("drawn", [0.0, 0.25, 0.5, 0.999999])
def test_full_jitter_draws_below_the_ceiling(drawn: float) -> None:
    backoff = JitteredBackoff(base=1.0, cap=8.0, jitter="full", random=_fixed(drawn))
    for attempt, ceiling in zip(range(1, 7), [1.0, 2.0, 4.0, 8.0, 8.0, 8.0], strict=True):
        delay = backoff.delay(attempt)
        assert delay == pytest.approx(ceiling * drawn)
        assert 0.0 <= delay < ceiling


@pytest.mark.parametrize("drawn", [0.0, 0.5, 0.999999])
def test_equal_jitter_keeps_half_the_ceiling(drawn: float) -> None:
    backoff = JitteredBackoff(base=2.0, cap=16.0, jitter="equal", random=_fixed(drawn))
    for attempt, ceiling in zip(range(1, 6), [2.0, 4.0, 8.0, 16.0, 16.0], strict=True):
        delay = backoff.delay(attempt)
        assert delay == pytest.approx(ceiling / 2 + ceiling / 2 * drawn)
        assert ceiling / 2 <= delay < ceiling


def test_a_random_source_out_of_range_cannot_leave_the_bounds() -> None:
    assert JitteredBackoff(base=1.0, cap=1.0, random=_fixed(7.0)).delay(1) == 1.0
    assert JitteredBackoff(base=1.0, cap=1.0, random=_fixed(-3.0)).delay(1) == 0.0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"base": -1}, "base"), ({"base": float("nan")}, "base"), ({"cap": float("inf")}, "cap"),
    ({"base": True}, "base"), ({"base": "1"}, "base"), ({"base": 2.0, "cap": 1.0}, "base"),
    ({"jitter": "half"}, "jitter"), ({"random": 0.5}, "random")])
def test_bad_backoff_arguments_are_refused(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(RetryArgumentError) as caught:
        JitteredBackoff(**kwargs)
    assert caught.value.field == field and isinstance(caught.value, InvalidInputError)


@pytest.mark.parametrize("attempt", [0, -1, True, 1.0])
def test_a_bad_attempt_number_is_refused(attempt: Any) -> None:
    with pytest.raises(RetryArgumentError):
        JitteredBackoff().delay(attempt)


# --- retry() ---------------------------------------------------------------------------------------------------


def test_retries_store_unavailable_then_returns() -> None:
    call, calls = _failing([StoreUnavailableError("locked"), StoreUnavailableError("locked")], result=42)
    slept: list[float] = []
    told: list[tuple[int, str, float]] = []
    result = retry(call, attempts=5, base=1.0, cap=3.0, sleep=slept.append, random=_fixed(0.5),
                   on_retry=lambda attempt, error, delay: told.append((attempt, str(error), delay)))
    assert result == 42 and calls == [1, 2, 3]
    assert slept == [0.5, 1.0]  # full jitter at 0.5 of the ceilings 1 and 2
    assert told == [(1, "locked", 0.5), (2, "locked", 1.0)]


def test_each_wait_is_bounded_by_its_ceiling_and_the_cap() -> None:
    call, _ = _failing([StoreUnavailableError("down")] * 9)
    slept: list[float] = []
    retry(call, attempts=10, base=0.25, cap=2.0, sleep=slept.append, random=_fixed(0.999))
    ceilings = [0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert len(slept) == 9
    assert all(0.0 <= delay < ceiling for delay, ceiling in zip(slept, ceilings, strict=True))
    assert max(slept) < 2.0


def test_the_last_error_is_raised_after_the_attempts() -> None:
    errors = [StoreUnavailableError(f"down {n}") for n in range(1, 4)]
    call, calls = _failing(list(errors))
    slept: list[float] = []
    with pytest.raises(StoreUnavailableError) as caught:
        retry(call, attempts=3, base=1.0, cap=1.0, jitter="none", sleep=slept.append)
    assert caught.value is errors[2] and calls == [1, 2, 3]
    assert slept == [1.0, 1.0]  # no wait after the last attempt


def test_one_attempt_never_waits() -> None:
    error = StoreUnavailableError("down")
    call, calls = _failing([error])
    slept: list[float] = []
    with pytest.raises(StoreUnavailableError) as caught:
        retry(call, attempts=1, sleep=slept.append)
    assert caught.value is error and calls == [1] and slept == []


@pytest.mark.parametrize("error", [
    InvalidInputError("bad room_id", field="room_id"), CapacityExceededError("full", limit="MAX_ACTIVE_ROOMS"),
    StorageError("disk"), ValueError("not ours")])
def test_other_errors_pass_through_at_once(error: BaseException) -> None:
    call, calls = _failing([error])
    slept: list[float] = []
    with pytest.raises(type(error)) as caught:
        retry(call, attempts=5, sleep=slept.append)
    assert caught.value is error and calls == [1] and slept == []


def test_a_retryable_error_then_another_passes_the_other_through() -> None:
    final = CapacityExceededError("full", limit="MAX_EVENTS_PER_ROOM")
    call, calls = _failing([StoreUnavailableError("down"), final])
    slept: list[float] = []
    with pytest.raises(CapacityExceededError) as caught:
        retry(call, attempts=5, sleep=slept.append, random=_fixed(0.0))
    assert caught.value is final and calls == [1, 2] and slept == [0.0]


def test_retry_on_names_what_is_retried() -> None:
    call, calls = _failing([TimeoutError("slow")], result="ok")
    assert retry(call, retry_on=(TimeoutError,), sleep=lambda _: None) == "ok" and calls == [1, 2]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"attempts": 0}, "attempts"), ({"attempts": 1001}, "attempts"), ({"attempts": True}, "attempts"),
    ({"attempts": 2.0}, "attempts"), ({"base": -0.1}, "base"), ({"cap": float("nan")}, "cap"),
    ({"base": 5.0, "cap": 1.0}, "base"), ({"jitter": "random"}, "jitter"), ({"retry_on": StoreUnavailableError},
                                                                            "retry_on"),
    ({"retry_on": ()}, "retry_on"), ({"retry_on": ("StoreUnavailableError",)}, "retry_on"),
    ({"sleep": None}, "sleep"), ({"random": 0.3}, "random"), ({"on_retry": "log"}, "on_retry")])
def test_bad_arguments_are_refused_before_any_call(kwargs: dict[str, Any], field: str) -> None:
    calls: list[int] = []
    with pytest.raises(RetryArgumentError) as caught:
        retry(lambda: calls.append(1), **kwargs)
    assert caught.value.field == field and calls == []


def test_a_call_that_is_not_callable_is_refused() -> None:
    with pytest.raises(RetryArgumentError) as caught:
        retry("append", attempts=2)  # type: ignore[arg-type]
    assert caught.value.field == "call"


# --- the command line's follow loops ---------------------------------------------------------------------------


def _room_with_events(engine: Any, count: int) -> list[dict[str, Any]]:
    from hostedrooms import rooms

    gateway = "install:gw-a"
    rooms.create_room(engine, room_id="r", name="r", members=[], authority_gateway_id=gateway, now=1)
    return [dict(rooms.append_event(engine, room_id="r", event_id=f"e-{n}", kind="message.user",
                                    actor={"kind": "user", "id": "u"}, payload={"n": n},
                                    authority_gateway_id=gateway, authority_epoch=1, now=1 + n))
            for n in range(1, count + 1)]


def _follow_cli(monkeypatch: pytest.MonkeyPatch, follow: Callable[..., Any], attempts: int = 10) -> list[float]:
    import types

    from hostedrooms.cli import inspect as cli

    slept: list[float] = []
    monkeypatch.setattr(cli, "room_service", types.SimpleNamespace(follow=follow))
    monkeypatch.setattr(cli, "follow_sleep", slept.append)
    monkeypatch.setattr(cli, "follow_backoff", JitteredBackoff(base=1.0, cap=60.0, random=_fixed(0.5)))
    monkeypatch.setattr(cli, "follow_attempts", attempts)
    return slept


def test_log_follow_follows_again_from_the_last_event_after_store_unavailable(
        engine: Any, target: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from factories import run_cli

    events = _room_with_events(engine, 3)
    calls: list[tuple[int, int | None]] = []

    def follow(_engine: Any, room_id: str, since: int, *, limit: int, poll_interval: float,
               last_event: dict[str, Any] | None) -> Any:
        calls.append((since, None if last_event is None else last_event["seq"]))
        if len(calls) == 1:
            yield events[0]
            raise StoreUnavailableError("the server closed the connection")
        if len(calls) == 2:
            raise StoreUnavailableError("connection refused")
        yield from events[since:]

    slept = _follow_cli(monkeypatch, follow)
    code, out, _ = run_cli(capsys, "log", "--url", target, "r", "--follow", "--json")
    assert code == 0
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [1, 2, 3]  # none skipped, none repeated
    assert calls == [(0, None), (1, 1), (1, 1)]  # resumed after seq 1, that event checked
    assert slept == [0.5, 1.0]  # full jitter at 0.5 of 1 s, then of 2 s


def test_log_follow_gives_up_after_its_attempts_with_the_last_error(
        engine: Any, target: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from factories import run_cli

    _room_with_events(engine, 1)
    calls: list[int] = []

    def follow(*_args: Any, **_kwargs: Any) -> Any:
        calls.append(1)
        raise StoreUnavailableError(f"down {len(calls)}")
        yield  # a generator, as follow() is

    slept = _follow_cli(monkeypatch, follow, attempts=3)
    code, out, err = run_cli(capsys, "log", "--url", target, "r", "--follow")
    assert code == 1 and out == "" and len(calls) == 3 and slept == [0.5, 1.0]
    assert "down 3" in err


def test_replicator_run_waits_jittered_doubling_delays_after_failed_passes(engine: Any) -> None:
    """``replicate --follow`` is ``Replicator.run``: a failed pass is retried after an equal-jitter wait."""
    import threading

    from hostedrooms.standby import Replicator
    from hostedrooms.standby.source import EnginePageSource

    class Unreachable(EnginePageSource):
        def list_rooms(self, *, after: str | None = None, limit: int = 500) -> Any:
            raise StoreUnavailableError("the source is restarting")

    class Stop(threading.Event):
        """Records each wait instead of waiting; set after the fifth."""

        def __init__(self) -> None:
            super().__init__()
            self.waits: list[float | None] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout)
            if len(self.waits) == 5:
                self.set()
            return self.is_set()

    stop, failed = Stop(), []
    Replicator(Unreachable(engine), engine, local_gateway_id="install:gw-b").run(
        interval=1.0, max_error_delay=6.0, stop=stop, random=_fixed(0.5),
        on_pass=lambda report: failed.append(bool(report.error)))
    assert failed == [True] * 5
    # Ceilings 1, 2, 4, 6, 6 (capped); equal jitter at 0.5: three quarters of each.
    assert stop.waits == [0.75, 1.5, 3.0, 4.5, 4.5]
