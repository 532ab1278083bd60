"""Secrets stay out of messages and logs (issue 14, section 4).

* A password given in a URL, as ``user:pw@`` or as a ``?password=`` query parameter, is masked in library errors
  and in everything the CLI prints.
* At SQLAlchemy's DEBUG level (``echo="debug"``, or the ``sqlalchemy.engine`` logger at DEBUG), engines that
  hostedrooms creates or adopts log statements but never a fetched row or a bound parameter: no chat message,
  lease token, grant, peer message body or outbound snapshot reaches a log, on both backends. A plain SQLAlchemy
  engine in the same capture does log its rows (so the capture would show a leak).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from factories import captured, connect_error, link, outbound, outbound_snapshot, prepare

import hostedrooms
from hostedrooms import HostedRoomError, StoreUnavailableError, peers, rooms
from hostedrooms.cli import main
from hostedrooms.db import create_engine
from hostedrooms.errors import describe_target, translate
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.testing import create_database, drop_database, unique_name

PASSWORD = "pw-7f3a-secret"
MESSAGE = "chat-message-5d1c-secret"
LEASE = "lease-token-88ab-secret"
ENVELOPE_BODY = "envelope-body-41e0-secret"
GRANT = "grant-9c1e-secret-value"
OUTBOUND_BODY = "outbound-body-2b77-secret"
SNAPSHOT = "snapshot-value-c3d9-secret"
RESPONSE = "hub-response-6e02-secret"
REPLY = "reply-body-a1f4-secret"
SECRETS = (MESSAGE, LEASE, ENVELOPE_BODY, GRANT, OUTBOUND_BODY, SNAPSHOT, RESPONSE, REPLY)
GATEWAY = "install:gw-local"


# --- passwords in URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    f"postgresql://alice@127.0.0.1:1/rooms?password={PASSWORD}",
    f"postgresql://alice@127.0.0.1:1/rooms?sslmode=disable&password={PASSWORD}",
    f"postgresql://alice:{PASSWORD}@127.0.0.1:1/rooms",
])
def test_an_unreachable_database_masks_every_password(url: str) -> None:
    message = str(connect_error(url, StoreUnavailableError, connect_timeout=2))
    assert "127.0.0.1:1/rooms" in message and "***" in message
    assert PASSWORD not in message


@pytest.mark.parametrize(("url", "problem"), [
    (f"mysql://alice@db.example/rooms?password={PASSWORD}", "unsupported database dialect"),
    (f"postgresql://alice@localhost:notaport/db?password={PASSWORD}", "malformed database URL"),
    (f"postgresql://alice:{PASSWORD}@localhost:notaport/db", "malformed database URL"),
    (f"postgresql+nodriver://alice@localhost/db?password={PASSWORD}", "which hostedrooms does not use"),
])
def test_refused_targets_mask_every_password(url: str, problem: str) -> None:
    with pytest.raises(HostedRoomError, match=problem) as caught:
        create_engine(url)
    assert "alice" in str(caught.value) and "***" in str(caught.value)
    assert PASSWORD not in str(caught.value)


def test_describe_target_masks_query_passwords_and_keeps_the_rest() -> None:
    url = f"postgresql://alice:{PASSWORD}@h:5432/db?sslmode=require&password={PASSWORD}&sslpassword={PASSWORD}"
    text = describe_target(url)
    assert PASSWORD not in text
    assert text.startswith("postgresql://alice:***@h:5432/db?") and "sslmode=require" in text
    assert "password=***" in text and "sslpassword=***" in text
    assert describe_target(sa.make_url(url)) == text
    assert describe_target("/var/lib/state.db") == "/var/lib/state.db"
    error = translate(sa.exc.OperationalError("SELECT 1", {}, Exception("boom")), url)
    assert PASSWORD not in str(error) and "boom" in str(error)


@pytest.mark.parametrize("command", ["rooms", "verify", "deliveries", "current", "upgrade"])
@pytest.mark.parametrize("url", [
    f"postgresql://alice@127.0.0.1:1/rooms?password={PASSWORD}",
    f"postgresql://alice@127.0.0.1:notaport/rooms?password={PASSWORD}",
    f"mysql://alice@db.example/rooms?password={PASSWORD}",
])
def test_the_cli_never_prints_a_password(command: str, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([command, "--url", url])
    out, err = capsys.readouterr()
    assert code == 1
    assert err.startswith("hostedrooms: error: ") and "***" in err
    assert PASSWORD not in out + err


@pytest.fixture
def masked_role_url(pg_admin_url: str) -> Iterator[sa.URL]:
    """A URL of an empty database on the test server, reached as a role whose password is PASSWORD."""
    psycopg = pytest.importorskip("psycopg")
    from psycopg import sql

    admin = sa.make_url(pg_admin_url)
    role, name = unique_name("masked_role"), unique_name("hostedrooms_masked")
    create_database(pg_admin_url, name)

    def run(statement: Any) -> None:
        with psycopg.connect(host=admin.host, port=admin.port, user=admin.username, password=admin.password,
                             dbname=admin.database, autocommit=True) as connection:
            connection.execute(statement)

    run(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(PASSWORD)))
    try:
        yield admin.set(drivername="postgresql+psycopg", username=role, password=None, database=name)
    finally:
        drop_database(pg_admin_url, name)
        run(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_cli_masks_a_query_password_of_a_reachable_server(
    masked_role_url: sa.URL, capsys: pytest.CaptureFixture[str]
) -> None:
    url = masked_role_url.update_query_dict({"password": PASSWORD}).render_as_string(hide_password=False)
    code = main(["rooms", "--url", url])
    out, err = capsys.readouterr()
    assert code == 1 and "no hostedrooms schema" in err and ":***@" in err  # connected, then refused
    assert PASSWORD not in out + err
    code = main(["upgrade", "--url", url.replace(PASSWORD, "wrong-" + PASSWORD)])
    out, err = capsys.readouterr()
    assert code == 1 and "password authentication failed" in err
    assert PASSWORD not in out + err


# --- rows and parameters at DEBUG --------------------------------------------------------------------------


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every logger, SQLAlchemy's included, at DEBUG."""
    caplog.set_level(logging.DEBUG)
    for name in ("sqlalchemy", "sqlalchemy.engine", "sqlalchemy.pool", "sqlalchemy.orm"):
        caplog.set_level(logging.DEBUG, logger=name)
    yield caplog


def exercise(engine: sa.Engine) -> None:
    """Write and read back every kind of secret the store holds."""
    rooms.create_room(engine, room_id="room-1", name="Room", members=[], authority_gateway_id=GATEWAY)
    rooms.append_event(engine, room_id="room-1", event_id="e1", kind="message.user",
                       actor={"kind": "user", "id": "u1"}, payload={"text": MESSAGE},
                       authority_gateway_id=GATEWAY, authority_epoch=1)
    assert rooms.read_events(engine, room_id="room-1")["events"][-1]["payload"] == {"text": MESSAGE}
    ledger = DeliveryLedger(engine)
    row, created = prepare(ledger, 1, lease_token=LEASE, message=ENVELOPE_BODY)
    assert created and row["lease_token"] == LEASE
    assert ledger.authorize("env-1") is not None
    assert ledger.prepare_response("env-1", request_id="resp-1", body=REPLY, request_response=False) is not None
    assert ledger.pending_responses(now=2**41)[0]["response_body"] == REPLY
    ledger.prepare_outbound(**outbound(snapshot=outbound_snapshot(note=SNAPSHOT), body=OUTBOUND_BODY))
    assert ledger.pending_outbound(now=2**39)[0]["body"] == OUTBOUND_BODY
    assert ledger.commit_outbound("out-1", {"text": RESPONSE}) is not None
    assert ledger.outbound("out-1")["response"] == {"text": RESPONSE}  # type: ignore[index]
    peers.upsert_room_link_record(engine, record=link(grant=GRANT, trace_id="trace-1"), max_links=5)
    assert peers.list_room_link_records(engine)[0]["grant"] == GRANT
    assert hostedrooms.verify(engine) == []


@pytest.mark.parametrize("echo", ["debug", False])
def test_no_secret_reaches_the_debug_log_of_a_created_engine(
    target: str, echo: Any, debug_logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    engine = hostedrooms.create_engine(target, echo=echo, echo_pool="debug")
    try:
        exercise(engine)
    finally:
        engine.dispose()
    text = captured(capfd, debug_logs)
    assert "INSERT INTO hosted_room_events" in text and "secure_peer_deliveries" in text  # statements are logged
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, f"secrets in the log: {leaked}"


def test_no_secret_reaches_the_debug_log_of_a_derived_engine(
    target: str, debug_logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    engine = hostedrooms.create_engine(target, echo="debug")
    try:
        derived = engine.execution_options(logging_token="derived").execution_options(compiled_cache=None)
        exercise(derived)
        with derived.connect() as connection:  # an ad-hoc query of a caller, on the derived engine
            assert connection.execute(sa.select(sa.literal(MESSAGE))).scalar_one() == MESSAGE
    finally:
        engine.dispose()
    text = captured(capfd, debug_logs)
    assert "[derived]" in text and "INSERT INTO hosted_room_events" in text
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, f"secrets in the log: {leaked}"


def test_no_secret_reaches_the_debug_log_of_an_adopted_engine(
    target: str, debug_logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    url = hostedrooms.db.resolve_url(target)
    plain = sa.create_engine(url, echo="debug")  # a caller's engine, parameters and rows logged
    engine = hostedrooms.create_engine(plain)
    try:
        exercise(engine)
    finally:
        engine.dispose()
    text = captured(capfd, debug_logs)
    assert "INSERT INTO hosted_room_events" in text
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, f"secrets in the log: {leaked}"


def test_the_debug_capture_would_show_a_row(
    target: str, debug_logs: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Control: a plain SQLAlchemy engine on the same database, not handed to hostedrooms, logs its rows."""
    plain = sa.create_engine(hostedrooms.db.resolve_url(target), echo="debug")
    try:
        with plain.connect() as connection:
            assert connection.execute(sa.select(sa.literal(MESSAGE))).scalar_one() == MESSAGE
    finally:
        plain.dispose()
    assert MESSAGE in captured(capfd, debug_logs)
