"""Passwords never reach the terminal, a log, a status or a span, whatever the URL form (issue 34, item 9).

* Database URLs are read as libpq reads them: the user info ends at the LAST ``@`` before the host part, user and
  password are percent-decoded, several hosts become ``?host=h1:p1,h2:p2``. What cannot be read (a ``%`` that
  is no escape, an ``@`` after the host part, a libpq keyword DSN, a scheme without ``//``) is refused with a
  message that masks the password.
* Every CLI command, enumerated from the parser (a new command is covered without a change here), is run with
  every URL form in every position (positional, before the command, after a mistyped option, as each of its
  URL options): no password in stdout, stderr or the logs, and the documented exit code.
* On a reachable PostgreSQL server, as a role whose password holds ``@ : / ? % #``: the CLI, ``status --json``,
  and the ``db.namespace`` span attribute name the database and never the password.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from factories import every_text

from hostedrooms import InvalidInputError, rooms, telemetry
from hostedrooms.cli import EXIT_FAILED, EXIT_OK, EXIT_STATUS_UNKNOWN, EXIT_USAGE, build_parser, main
from hostedrooms.db import create_engine, is_keyword_dsn, parse_url, resolve_url
from hostedrooms.errors import describe_target, redact
from hostedrooms.testing import create_database, drop_database, unique_name

#: Two halves: a leak of either part (a parser splitting at the first "@") shows in the output.
HEAD, TAIL = "pw-head-6b1f", "pw-tail-93ce"
RAW = f"{HEAD}@:#{TAIL}"  # raw "@", ":" and "#" are read as libpq reads them
FULL = f"{HEAD}@:/?%#{TAIL}"  # "/", "?" and "%" must be percent-encoded
ENCODED = quote(FULL, safe="")
SERVER = "127.0.0.1:1"  # nothing listens: a connection is refused at once

#: Every URL form, on a server that refuses connections: (name, target).
FORMS = [
    ("raw-at", f"postgresql://alice:{RAW}@{SERVER}/rooms"),
    ("encoded", f"postgresql://alice:{ENCODED}@{SERVER}/rooms"),
    ("raw-slash", f"postgresql://alice:{HEAD}/{TAIL}@{SERVER}/rooms"),
    ("raw-question", f"postgresql://alice:{HEAD}?{TAIL}@{SERVER}/rooms"),
    ("bad-percent", f"postgresql://alice:{HEAD}%zz{TAIL}@{SERVER}/rooms"),
    ("query", f"postgresql://alice@{SERVER}/rooms?sslmode=disable&password={ENCODED}"),
    ("multi-host-query", f"postgresql://alice:{RAW}@/rooms?host={SERVER},127.0.0.1:2"),
    ("multi-host", f"postgresql://alice:{RAW}@{SERVER},127.0.0.1:2/rooms"),
    ("psycopg", f"postgresql+psycopg://alice:{RAW}@{SERVER}/rooms"),
    ("keyword-dsn", f"host=127.0.0.1 port=1 user=alice password='{HEAD} {TAIL}' dbname=rooms"),
    ("no-slashes", f"postgresql:alice:{RAW}@{SERVER}/rooms"),
]
SECRETS = (HEAD, TAIL, RAW, FULL, ENCODED)


def assert_no_secret(text: str, *secrets: str) -> None:
    for secret in secrets or SECRETS:
        assert secret not in text, f"{secret!r} leaked in: {text[:2000]}"


# --- the parser: libpq's rules -------------------------------------------------------------------------------


def test_the_last_at_before_the_host_ends_the_user_info() -> None:
    url = parse_url(f"postgresql://alice:{RAW}@db.example:5433/rooms")
    assert (url.username, url.password, url.host, url.port, url.database) == (
        "alice", RAW, "db.example", 5433, "rooms")
    assert resolve_url(f"postgresql://alice:{RAW}@db.example/rooms").drivername == "postgresql+psycopg"


def test_user_and_password_are_percent_decoded() -> None:
    url = parse_url(f"postgresql+psycopg://al%40ice:{ENCODED}@h/rooms")
    assert (url.username, url.password, url.drivername) == ("al@ice", FULL, "postgresql+psycopg")
    assert parse_url("postgresql://alice@h/rooms").password is None
    assert parse_url("postgresql://alice:@h/rooms").password == ""
    assert parse_url("postgresql://h/rooms").username is None


def test_several_hosts_become_libpq_host_parameters() -> None:
    for text in (f"postgresql://alice:{RAW}@h1:5432,h2:5433/rooms",
                 f"postgresql://alice:{RAW}@/rooms?host=h1:5432,h2:5433"):
        url = resolve_url(text)
        assert url.query["host"] == ("h1:5432", "h2:5433") and url.host is None
        assert (url.password, url.database) == (RAW, "rooms")


def test_sqlite_urls_and_paths_are_unchanged() -> None:
    assert parse_url("sqlite:////tmp/a@b/state.db").database == "/tmp/a@b/state.db"
    assert resolve_url("state.db").database == str(Path("state.db").resolve())
    assert resolve_url("C:state.db").get_backend_name() == "sqlite"  # one letter: a drive, not a scheme


@pytest.mark.parametrize(("text", "problem"), [
    (f"postgresql://alice:{HEAD}%zz{TAIL}@h/rooms", "percent-encoded"),
    (f"postgresql://alice:{HEAD}/{TAIL}@h/rooms", "an '@' follows the host part"),
    (f"postgresql://alice:{HEAD}?{TAIL}@h/rooms", "an '@' follows the host part"),
    (f"postgresql://alice:{RAW}@h:port/rooms", "malformed database URL"),
    (f"post gres://alice:{RAW}@h/rooms", "malformed database URL"),
    (f"host=h password={RAW} dbname=rooms", "libpq keyword DSN"),
    (f"  dbname = rooms  password = '{HEAD} \\' {TAIL}' ", "libpq keyword DSN"),
    (f"postgresql:alice:{RAW}@h/rooms", "without '//'"),
])
def test_what_is_not_understood_is_refused_without_the_password(text: str, problem: str) -> None:
    with pytest.raises(InvalidInputError, match=problem) as caught:
        resolve_url(text)
    assert caught.value.field == "target"
    assert_no_secret(every_text(caught.value))


def test_keyword_dsns_are_told_from_file_names() -> None:
    assert is_keyword_dsn("host=h dbname=rooms") and is_keyword_dsn("password='a b' user=x")
    assert not is_keyword_dsn("a=b.db") and not is_keyword_dsn("state.db")


# --- masking ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "text"), FORMS)
def test_every_form_is_masked_as_text_and_parsed(name: str, text: str) -> None:
    assert_no_secret(describe_target(text))
    assert_no_secret(redact(f"error: unrecognized arguments: --catchup-from {text} failover\nnext line"))
    assert redact(f"a\n{text}\nb").startswith("a\n") and redact(f"a\n{text}\nb").endswith("\nb")
    try:
        url = resolve_url(text)
    except InvalidInputError as exc:
        assert_no_secret(every_text(exc))
    else:
        assert_no_secret(describe_target(url))
        assert_no_secret(repr(url) + str(url))
        assert url.password in (None, RAW, FULL) or url.query.get("password") == FULL


def test_a_query_password_becomes_the_password_and_stays_masked() -> None:
    url = resolve_url(f"postgresql://h:5432/rooms?user=gw&password={ENCODED}")
    assert url.password == FULL and "password" not in url.query
    assert describe_target(url) == "postgresql+psycopg://h:5432/rooms?user=gw&password=***"
    assert resolve_url(f"postgresql://gw:other@h/rooms?password={ENCODED}").password == FULL  # libpq: it wins
    assert_no_secret(repr(url) + str(url) + repr(sa.create_engine(url)))


def test_redact_keeps_text_without_a_secret() -> None:
    text = "room r-1 refused: MAX_ROOM_EVENTS at postgresql://alice@h:5432/rooms?sslmode=require"
    assert redact(text) == text
    assert redact("two postgresql://a:one@h/x and sqlite:///p?password=two") == (
        "two postgresql://a:***@h/x and sqlite:///p?password=***")
    assert redact("password = 'a b' user=x") == "password = *** user=x"


# --- every CLI command, every form, every position ------------------------------------------------------------


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the parser has no subcommands")


COMMANDS = _subcommands()
#: Options taking a database or a source: every one is tried with each form.
URL_OPTION_WORDS = ("url", "to", "from", "catch-up-from")


def _url_options(sub: argparse.ArgumentParser) -> list[str]:
    return [option for action in sub._actions for option in action.option_strings
            if (option.startswith("--") and option[2:] in URL_OPTION_WORDS) or option.startswith("--url")
            or option.endswith("-url")]


def _required(sub: argparse.ArgumentParser, given: str, tmp_path: Path) -> list[str]:
    """Values for the required options other than ``given``: a gateway id, a missing SQLite file."""
    filled: list[str] = []
    for action in sub._actions:
        if action.required and action.option_strings and given not in action.option_strings:
            value = "install:gw-x" if "gateway" in action.dest else str(tmp_path / "missing.db")
            filled += [action.option_strings[-1], value]
    return filled


def _positionals(sub: argparse.ArgumentParser) -> int:
    return sum(1 for action in sub._actions if not action.option_strings)


def _required_positionals(sub: argparse.ArgumentParser) -> list[str]:
    """A value for each required positional (a room id)."""
    return ["r-1" for action in sub._actions if not action.option_strings and action.nargs is None]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    text = "\n".join((out, err, caplog.text))
    caplog.clear()
    return code, text


def _usage(command: str) -> int:
    return EXIT_STATUS_UNKNOWN if command == "status" else EXIT_USAGE


def _accepted(text: str) -> bool:
    try:
        resolve_url(text)
    except InvalidInputError:
        return False
    return True


@pytest.fixture
def quiet_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Path:
    """A working folder with no state.db, no database URL in the environment, every log captured."""
    monkeypatch.chdir(tmp_path)
    for name in ("HOSTEDROOMS_DATABASE_URL", "HOSTEDROOMS_LISTEN_URL", "HOSTEDROOMS_POOLER", "HOSTEDROOMS_SCHEMA"):
        monkeypatch.delenv(name, raising=False)
    caplog.set_level(logging.DEBUG)
    return tmp_path


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(("name", "text"), FORMS, ids=[name for name, _ in FORMS])
def test_every_command_never_prints_a_password(
    command: str, name: str, text: str, quiet_cwd: Path, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    sub = COMMANDS[command]
    usage = _usage(command)
    runs: list[tuple[list[str], set[int]]] = [
        ([text, command], {usage}),  # before the command
        ([command, "--catchup-from", text], {usage}),  # after a mistyped option
        ([command, text], {EXIT_FAILED} if _positionals(sub) else {usage}),  # positional
    ]
    for option in _url_options(sub):
        argv = [command, *_required_positionals(sub), *_required(sub, option, quiet_cwd), option, text]
        if command == "alembic-ini":  # writes the URL into its file, on purpose: not to the terminal
            runs.append(([*argv, str(quiet_cwd / f"{name}.ini")], {EXIT_OK if _accepted(text) else EXIT_FAILED}))
            continue
        expected = {EXIT_STATUS_UNKNOWN} if command == "status" else {EXIT_FAILED}
        runs.append((argv, expected))
        if command == "status":
            runs.append(([*argv, "--json"], expected))
        if command in ("replicate", "failover", "log"):
            runs.append(([*argv, "--log-level", "debug", "--log-format", "json"], expected))
    assert len(runs) > 3 or command in ("demo",) or not _url_options(sub)
    for argv, expected in runs:
        code, printed = _run(argv, capsys, caplog)
        assert code in expected, (argv[0] if argv[0] in COMMANDS else command, code, redact(printed))
        assert_no_secret(printed)


# --- a reachable server, a role with every reserved character in its password -----------------------------


@contextlib.contextmanager
def _role_with_password(pg_admin_url: str, password: str) -> Iterator[sa.URL]:
    """An empty database on the test server owned by a new role whose password is ``password``, as a URL."""
    psycopg = pytest.importorskip("psycopg")
    from psycopg import sql

    admin = sa.make_url(pg_admin_url)
    role, name = unique_name("secret_role"), unique_name("hostedrooms_secret")
    create_database(pg_admin_url, name)

    def run(statement: Any) -> None:
        with psycopg.connect(host=admin.host, port=admin.port, user=admin.username, password=admin.password,
                             dbname=admin.database, autocommit=True) as connection:
            connection.execute(statement)

    run(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
    run(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(name), sql.Identifier(role)))
    try:
        yield admin.set(drivername="postgresql", username=role, password=password, database=name)
    finally:
        drop_database(pg_admin_url, name)
        run(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def secret_role(pg_admin_url: str) -> Iterator[sa.URL]:
    """A role whose password is FULL (``@ : / ? % #``) and its own empty database."""
    with _role_with_password(pg_admin_url, FULL) as url:
        yield url


def test_a_raw_at_in_a_password_reaches_the_server(
    pg_admin_url: str, quiet_cwd: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    with _role_with_password(pg_admin_url, RAW) as url:
        raw = f"postgresql://{url.username}:{RAW}@{url.host}:{url.port}/{url.database}"
        for argv in (["upgrade"], ["rooms"], ["status", "--json"]):
            code, printed = _run([*argv, "--url", raw], capsys, caplog)
            assert code == EXIT_OK, (argv, redact(printed))
            assert_no_secret(printed)


def _reachable_forms(url: sa.URL) -> list[str]:
    """The forms that reach the server as ``url``'s role (the password percent-encoded, where it must be)."""
    where, user = f"{url.host}:{url.port}", url.username
    return [
        f"postgresql://{user}:{ENCODED}@{where}/{url.database}",
        f"postgresql+psycopg://{user}:{ENCODED}@{where}/{url.database}",
        f"postgresql://{user}@{where}/{url.database}?password={ENCODED}",
        f"postgresql://{user}:{ENCODED}@/{url.database}?host={where},127.0.0.1:1",
    ]


def test_the_cli_on_a_reachable_server_never_prints_the_password(
    secret_role: sa.URL, quiet_cwd: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    forms = _reachable_forms(secret_role)
    code, printed = _run(["upgrade", "--url", forms[0]], capsys, caplog)
    assert code == EXIT_OK, redact(printed)
    assert_no_secret(printed)
    for form in forms:
        for argv in (["rooms"], ["verify"], ["current"], ["status"], ["status", "--json"]):
            code, printed = _run([*argv, "--url", form], capsys, caplog)
            assert code == EXIT_OK, (argv, redact(printed))
            assert_no_secret(printed)
        code, printed = _run(["status", "--json", "--url", form.replace(ENCODED, "wrong" + ENCODED)], capsys, caplog)
        assert code == EXIT_STATUS_UNKNOWN and "credentials" in printed
        assert_no_secret(printed, HEAD, TAIL, FULL)
    code, printed = _run(["status", "--json", "--url", forms[0]], capsys, caplog)
    assert f'"target": "postgresql://{secret_role.username}:***@' in printed


def test_the_span_names_the_database_never_the_password(secret_role: sa.URL) -> None:
    pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from hostedrooms import migrate

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(tracer_provider=provider)
    try:
        for form in _reachable_forms(secret_role):
            engine = create_engine(form)
            try:
                migrate.upgrade(engine)
                assert rooms.list_rooms(engine) == []
            finally:
                engine.dispose()
        # A raw "@" in the password: the role's password is FULL, so this one is refused by the server.
        engine = create_engine(f"postgresql://{secret_role.username}:{RAW}@{secret_role.host}:{secret_role.port}/"
                               f"{secret_role.database}")
        with pytest.raises(Exception) as caught:
            rooms.list_rooms(engine)
        engine.dispose()
        assert_no_secret(every_text(caught.value), HEAD, TAIL, RAW, FULL)
    finally:
        telemetry.configure()
        provider.shutdown()
    spans = exporter.get_finished_spans()
    assert spans and {span.attributes.get("db.namespace") for span in spans if span.attributes} >= {
        secret_role.database}
    assert_no_secret("\n".join(span.to_json() for span in spans))


def test_status_json_of_a_sqlite_store_never_shows_a_listen_url_password(
    quiet_cwd: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, sqlite_template: Path,
) -> None:
    from hostedrooms.testing import copy_template

    path = copy_template(sqlite_template, quiet_cwd / "state.db")
    code, printed = _run(["status", "--json", "--url", f"sqlite:///{path}"], capsys, caplog)
    assert code == EXIT_OK and f'"target": "sqlite:///{path}"' in printed
    for _, text in FORMS:
        code, printed = _run(["status", "--json", "--url", f"sqlite:///{path}", "--listen-url", text], capsys, caplog)
        assert code == EXIT_STATUS_UNKNOWN and '"state": "unknown"' in printed
        assert_no_secret(printed)
