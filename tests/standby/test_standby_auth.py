"""Page server authentication (issue #34 item 5): a shared bearer token, compared in constant time, required
beyond loopback; one 401 for every path without it, naming no room; TLS through the standard library's ssl;
the token read from a file or the environment by `serve-pages`, `replicate` and `failover`, and never shown."""

from __future__ import annotations

import argparse
import contextlib
import hmac
import http.client
import io
import logging
import os
import pickle
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from standby_support import GATEWAY_A, GATEWAY_B, host, replica_log, room_log

from hostedrooms.cli import main
from hostedrooms.cli import standby as cli
from hostedrooms.errors import InvalidInputError
from hostedrooms.standby import (
    EnginePageSource,
    HttpPageSource,
    PageServer,
    PageToken,
    Replicator,
    SourceAuthenticationError,
    SourceUnavailableError,
    client_tls_context,
    read_token_file,
    server_tls_context,
    token_from_env,
)
from hostedrooms.standby.auth import TOKEN_ENV
from hostedrooms.standby.replicator import CAUGHT_UP

pytest_plugins = ["standby_fixtures"]

CLI = [sys.executable, "-m", "hostedrooms.cli"]
ROOM = "secret-room-7f3a"
sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # no store behaviour involved


@pytest.fixture
def token() -> str:
    return secrets.token_urlsafe(32)


@pytest.fixture
def token_file(tmp_path: Path, token: str) -> Path:
    path = tmp_path / "page.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def _get(url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(str(parts.hostname), parts.port, timeout=10)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, {key.lower(): value for key, value in response.getheaders()}, response.read()
    finally:
        connection.close()


# --- the server's answer without the token ---------------------------------------------------------------------

PATHS = ["/standby/rooms", "/standby/rooms?limit=1", f"/standby/rooms/{ROOM}", f"/standby/rooms/{ROOM}/events",
         f"/standby/rooms/{ROOM}/events?since_seq=0&limit=5", "/standby/change", "/standby/rooms/nowhere",
         "/standby/unknown", "/elsewhere", "/", "/standby/rooms/a/b/c"]


@sqlite_only
def test_without_the_token_every_path_gets_the_same_401_naming_no_room(engine: Engine, token: str) -> None:
    host(engine, ROOM, 3)
    wrong = [{}, {"Authorization": "Bearer " + token[:-1] + ("x" if token[-1] != "x" else "y")},
             {"Authorization": "Bearer"}, {"Authorization": "Basic " + token}, {"Authorization": token},
             {"Authorization": f"Bearer {token} extra"}, {"X-Token": token}]
    answers = set()
    with PageServer(EnginePageSource(engine), prefix="/standby", token=token) as server:
        assert token not in repr(vars(server)) and token not in repr(server)
        for path in PATHS:
            for headers in wrong:
                status, got, body = _get(server.url, path, headers)
                assert status == 401, (path, headers)
                assert got["www-authenticate"].startswith("Bearer")
                assert got["content-type"] == "application/json" and got["connection"] == "close"
                answers.add(body)
        status, _, body = _get(server.url, f"/standby/rooms/{ROOM}", {"Authorization": f"Bearer {token}"})
        assert status == 200 and ROOM.encode() in body
        status, _, body = _get(server.url, "/standby/unknown", {"Authorization": f"bearer {token}"})
        assert status == 404  # with the token, an unknown path is what it is
    assert len(answers) == 1  # the same bytes whatever the path: no 404 beside the 401, no room named
    (only,) = answers
    assert ROOM.encode() not in only and b"secret" not in only and len(only) < 100


@sqlite_only
def test_two_authorization_headers_are_refused_even_if_one_is_right(engine: Engine, token: str) -> None:
    with PageServer(EnginePageSource(engine), token=token) as server:
        parts = urllib.parse.urlsplit(server.url)
        connection = http.client.HTTPConnection(str(parts.hostname), parts.port, timeout=10)
        try:
            connection.putrequest("GET", "/rooms")
            connection.putheader("Authorization", f"Bearer {token}")
            connection.putheader("Authorization", "Bearer nope-nope-nope-nope")
            connection.endheaders()
            assert connection.getresponse().status == 401
        finally:
            connection.close()


@sqlite_only
def test_the_token_is_compared_with_compare_digest_and_its_verdict_decides(
        engine: Engine, token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, Any]] = []
    verdict: list[bool] = []
    real = hmac.compare_digest

    def observed(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return verdict[0] if verdict else real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", observed)
    host(engine, ROOM, 1)
    with PageServer(EnginePageSource(engine), token=token) as server:
        source = HttpPageSource(server.url, token=token)
        try:
            assert [head.room_id for head in source.list_rooms()] == [ROOM]
            assert calls and all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in calls)
            verdict.append(False)  # the right token, but the comparison says no: refused
            with pytest.raises(SourceAuthenticationError):
                source.list_rooms()
        finally:
            source.close()


# --- binding ---------------------------------------------------------------------------------------------------


@sqlite_only
def test_a_server_beyond_loopback_needs_a_token_or_an_explicit_opt_out(engine: Engine, token: str,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    source = EnginePageSource(engine)
    with pytest.raises(InvalidInputError, match=r"refusing to serve every room on 0\.0\.0\.0 .*without a token"):
        PageServer(source, ("0.0.0.0", 0))
    for options in ({"token": token}, {"insecure_no_token": True}, {"authorize": lambda headers: False}):
        with caplog.at_level(logging.WARNING, logger="hostedrooms.standby.server"):
            caplog.clear()
            with PageServer(source, ("0.0.0.0", 0), **options) as server:
                assert server.server_address[0] == "0.0.0.0"
        opted_out = [record for record in caplog.records if "serves every room" in record.getMessage()]
        assert len(opted_out) == (1 if "insecure_no_token" in options else 0)
    with PageServer(source) as server:  # loopback: optional, and honoured when set
        assert _get(server.url, "/rooms")[0] == 200
    with PageServer(source, token=token) as server:
        assert _get(server.url, "/rooms")[0] == 401


# --- the token's value -----------------------------------------------------------------------------------------


@sqlite_only
@pytest.mark.parametrize("value", ["", "short", "x" * 1025, "has a space-in-it-0123", "line\nbreak-0123456789",
                                   "tab\tinside-0123456789", "n\u00f6n-ascii-0123456789", b"\x00" * 20, 12345])
def test_invalid_tokens_are_refused_without_being_quoted(value: Any, engine: Engine) -> None:
    with pytest.raises(InvalidInputError) as refused:
        PageToken(value)
    assert refused.value.field == "token"
    if isinstance(value, str) and len(value) > 8:
        assert value not in str(refused.value)
    with pytest.raises(InvalidInputError):
        HttpPageSource("http://127.0.0.1:1", token=value)
    with pytest.raises(InvalidInputError):
        PageServer(EnginePageSource(engine), token=value)


def test_a_token_never_shows_itself(token: str) -> None:
    held = PageToken(token)
    assert token not in repr(held) and token not in str(held) and token not in f"{held}"
    with pytest.raises(TypeError):
        pickle.dumps(held)
    assert PageToken(token.encode()).header() == f"Bearer {token}"
    source = HttpPageSource("http://127.0.0.1:1/standby", token=token)
    assert token not in repr(source) and token not in repr(vars(source)) and token not in source.describe()
    with pytest.raises(Exception, match="not both"):
        HttpPageSource("http://127.0.0.1:1", token=token, headers={"authorization": "Bearer x"})


def test_a_token_file_holds_one_line_and_is_not_open_to_others(tmp_path: Path, token: str) -> None:
    path = tmp_path / "t"
    for content in (token, token + "\n", token + "\r\n"):
        path.write_text(content, newline="")
        path.chmod(0o600)
        assert read_token_file(path).header() == f"Bearer {token}"
    path.chmod(0o640)  # shared with the service's group: allowed
    assert read_token_file(path).header() == f"Bearer {token}"
    for mode in (0o644, 0o604, 0o620, 0o602):
        path.chmod(mode)
        with pytest.raises(InvalidInputError, match=f"open to others \\(mode {mode:04o}\\)"):
            read_token_file(path)
    path.chmod(0o600)
    for content in (token + "\n\n", f"{token}\n{token}\n", " " + token, "", "\n", token * 40):
        path.write_text(content, newline="")
        with pytest.raises(InvalidInputError) as refused:
            read_token_file(path)
        assert refused.value.field == "token_file" and token not in str(refused.value)
    with pytest.raises(InvalidInputError, match="cannot read the token file .*FileNotFoundError"):
        read_token_file(tmp_path / "missing")


def test_the_environment_variable_holds_the_token(token: str) -> None:
    assert token_from_env({}) is None and token_from_env({TOKEN_ENV: ""}) is None
    held = token_from_env({TOKEN_ENV: token})
    assert held is not None and held.header() == f"Bearer {token}"
    with pytest.raises(InvalidInputError, match=TOKEN_ENV.replace("$", r"\$")) as refused:
        token_from_env({TOKEN_ENV: "short token"})
    assert "short token" not in str(refused.value)


# --- the client ------------------------------------------------------------------------------------------------


def test_replication_with_the_token_equals_replication_from_the_engine(engine: Engine, standby: Engine,
                                                                       token: str) -> None:
    host(engine, ROOM, 700)
    host(engine, "other", 2)
    with PageServer(EnginePageSource(engine), prefix="/standby", token=token.encode()) as server:
        source = HttpPageSource(server.url, token=token)
        try:
            report = Replicator(source, standby).sync_once()
            assert {room.status for room in report.rooms} == {CAUGHT_UP} and report.events == 702
            assert source.change_token() is not None
        finally:
            source.close()
    assert replica_log(standby, ROOM) == room_log(engine, ROOM)


@sqlite_only
def test_a_refused_token_ends_the_pass_and_refuses_no_room(engine: Engine, standby: Engine, token: str) -> None:
    host(engine, ROOM, 2)
    with PageServer(EnginePageSource(engine), token=token) as server:
        for given, says in ((None, "it requires a token, and none was given"),
                            ("another-token-0123456789", "it refused the token")):
            source = HttpPageSource(server.url, token=given)
            try:
                with pytest.raises(SourceAuthenticationError, match="answered 401: " + says) as refused:
                    source.room_info(ROOM)
                assert isinstance(refused.value, SourceUnavailableError)
                assert token not in str(refused.value) and (given is None or given not in str(refused.value))
                assert source.change_token() is None  # a hint only: the pass reports the error
                report = Replicator(source, standby).sync_once()
                assert report.rooms == [] and report.error is not None and says in report.error
                assert not report.ok
            finally:
                source.close()


# --- the command line ------------------------------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_replicate_and_failover_read_the_token_from_a_file_or_the_environment(
        engine: Engine, standby: Engine, standby_target: str, token: str, token_file: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    host(engine, ROOM, 5)
    logs = ["--log-format", "json", "--log-level", "debug"]
    seen = ""
    with PageServer(EnginePageSource(engine), prefix="/standby", token=token) as server:
        code, out, err = _run(capsys, "replicate", "--from", server.url, "--to", standby_target, *logs)
        seen += out + err
        assert code == 1 and "answered 401: it requires a token" in out
        code, out, err = _run(capsys, "replicate", "--from", server.url, "--to", standby_target,
                              "--token-file", str(token_file), *logs)
        seen += out + err
        assert code == 0 and out.startswith("replicate: 1 room (1 caught-up); 5 events in 1 page")
        host(engine, "later", 1)
        monkeypatch.setenv(TOKEN_ENV, token)
        code, out, err = _run(capsys, "replicate", "--from", server.url, "--to", standby_target, *logs)
        seen += out + err
        assert code == 0 and out.startswith("replicate: 2 rooms (2 caught-up); 1 event in 1 page")
        host(engine, "last", 1)
        argv = ["failover", "--from-gateway", GATEWAY_A, "--to", standby_target, "--gateway", GATEWAY_B,
                "--catch-up-from", server.url, *logs]
        monkeypatch.delenv(TOKEN_ENV)
        code, out, err = _run(capsys, *argv)
        seen += out + err
        assert code == 1 and "the catch-up from " in err and "it requires a token" in err
        assert out.startswith("catch-up: 0 rooms (none); 0 events in 0 pages") and "answered 401" in out
        code, out, err = _run(capsys, *argv, "--token-file", str(token_file))
        seen += out + err
        assert code == 0 and out.splitlines()[-1] == f"failover: promoted 3 of 3 rooms of {GATEWAY_A} on {GATEWAY_B}"
    assert '"levelname"' in seen or '"level"' in seen  # the logs were on
    assert token not in seen


@sqlite_only
@pytest.mark.parametrize(("extra", "message"), [
    (["--token-file", "{token_file}"], "--token-file and --tls-ca apply to an http(s):// page source only"),
    (["--tls-ca", "{token_file}"], "--token-file and --tls-ca apply to an http(s):// page source only"),
])
def test_client_options_are_refused_where_they_would_be_ignored(
        extra: list[str], message: str, target: str, standby_target: str, token_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = [part.format(token_file=token_file) for part in extra]
    code, _, err = _run(capsys, "replicate", "--from", target, "--to", standby_target, *argv)
    assert code == 1 and message in err
    code, _, err = _run(capsys, "failover", "--from-gateway", GATEWAY_A, "--to", standby_target, "--gateway",
                        GATEWAY_B, *argv)
    assert code == 1 and message in err
    code, _, err = _run(capsys, "replicate", "--from", "http://127.0.0.1:1", "--to", standby_target, "--tls-ca",
                        str(token_file))
    assert code == 1 and "--tls-ca needs an https:// page source" in err


def test_a_token_sent_in_clear_beyond_loopback_is_warned_about(token: str, token_file: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(token_file=str(token_file), tls_ca=None)
    for url in ("http://127.0.0.1:1/standby", "http://localhost:1", "http://[::1]:1", "https://10.0.0.5:1"):
        assert cli._page_client_options(args, url)["token"] is not None
        assert capsys.readouterr().err == ""
    cli._page_client_options(args, "http://10.0.0.5:8470/standby")
    err = capsys.readouterr().err
    assert err == ("hostedrooms: WARNING: the page token is sent in clear to http://10.0.0.5:8470/standby: use "
                   "https://\n")
    cli._page_client_options(argparse.Namespace(token_file=None, tls_ca=None), "http://10.0.0.5:8470/standby")
    assert capsys.readouterr().err == ""  # no token, nothing to leak (the server will answer 401)


@sqlite_only
def test_serve_pages_warns_when_the_token_would_cross_the_network_in_clear(
        target: str, token: str, token_file: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    stop = threading.Event()

    @contextlib.contextmanager
    def stopped_by_the_test() -> Iterator[threading.Event]:
        yield stop

    monkeypatch.setattr(cli, "_stop_on_signals", stopped_by_the_test)
    out = io.StringIO()
    codes: list[int] = []
    serving = threading.Thread(target=lambda: codes.append(main(
        ["serve-pages", "--url", target, "--listen", "0.0.0.0:0", "--token-file", str(token_file)], out=out)))
    serving.start()
    deadline = time.monotonic() + 30
    while "serve-pages: " not in out.getvalue() and serving.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    serving.join(30)
    assert not serving.is_alive() and codes == [0]
    assert "(token required)" in out.getvalue()
    err = capsys.readouterr().err
    assert "hostedrooms: WARNING: the token and the pages cross the network in clear at http://0.0.0.0:" in err
    assert token not in out.getvalue() + err


def test_there_is_no_token_option_on_the_command_line(token: str, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["serve-pages"], ["replicate", "--from", "x"], ["failover", "--from-gateway", "g"]):
        for given in (["--token", token], [f"--token={token}"], ["--token"]):
            with pytest.raises(SystemExit) as refused:
                main([*command, *given])
            err = capsys.readouterr().err
            assert refused.value.code == 2 and "there is no --token option" in err and token not in err


# --- serve-pages, in a process of its own ----------------------------------------------------------------------


class _Served:
    """``hostedrooms serve-pages ...`` in a child process: its first line (the URL), then SIGTERM."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.child = subprocess.Popen([*CLI, "serve-pages", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, text=True, env=env)
        self._lines: queue.Queue[str] = queue.Queue()
        self._err: list[str] = []
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            self._lines.put(line)

    def _read_err(self) -> None:
        assert self.child.stderr is not None
        self._err.append(self.child.stderr.read())

    def first_line(self) -> str:
        try:
            return self._lines.get(timeout=60)
        except queue.Empty:
            raise AssertionError("serve-pages printed nothing within 60 s") from None

    def stop(self) -> tuple[int, str, str]:
        """SIGTERM; the exit code, what it printed after the first line, and its stderr."""
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
        try:
            self.child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait(timeout=60)
            raise AssertionError("serve-pages did not stop on SIGTERM within 60 s") from None
        for reader in self._readers:
            reader.join(timeout=30)
            assert not reader.is_alive(), "the child's output did not end"
        rest = []
        while not self._lines.empty():
            rest.append(self._lines.get_nowait())
        return self.child.returncode, "".join(rest), "".join(self._err)


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != TOKEN_ENV}
    return env | extra


@pytest.fixture
def served() -> Iterator[list[_Served]]:
    started: list[_Served] = []
    yield started
    for server in started:
        if server.child.poll() is None:
            server.stop()


@sqlite_only
def test_serve_pages_refuses_a_public_address_without_a_token(target: str, served: list[_Served]) -> None:
    refused = subprocess.run([*CLI, "serve-pages", "--url", target, "--listen", "0.0.0.0:0"], capture_output=True,
                             text=True, timeout=120, env=_env(), check=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "refusing to serve every room on 0.0.0.0 (not a loopback address) without a token" in refused.stderr
    served.append(_Served(["--url", target, "--listen", "0.0.0.0:0", "--insecure-no-token"], _env()))
    line = served[0].first_line()
    assert line.startswith("serve-pages: ") and "(no token)" in line
    code, _, err = served[0].stop()
    assert code == 0 and "WARNING" in err and "WITHOUT A TOKEN" in err


def test_serve_pages_with_a_token_from_the_environment(engine: Engine, target: str, standby_target: str,
                                                       token: str, token_file: Path, served: list[_Served],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    host(engine, ROOM, 3)
    served.append(_Served(["--url", target, "--prefix", "/standby"], _env(**{TOKEN_ENV: token})))
    line = served[0].first_line()
    assert line.endswith("/standby (token required)\n"), line
    url = line.split(" at ")[1].split(" (")[0]
    assert _get(url, "/standby/rooms")[0] == 401
    code, out, _ = _run(capsys, "replicate", "--from", url, "--to", standby_target, "--token-file", str(token_file))
    assert code == 0 and out.startswith("replicate: 1 room (1 caught-up); 3 events")
    code, rest, err = served[0].stop()
    assert code == 0 and rest == "serve-pages: stopped\n" and token not in line + rest + err


# --- TLS -------------------------------------------------------------------------------------------------------

_TLS_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = hostedrooms
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
"""


def _openssl(folder: Path, *argv: str) -> None:
    subprocess.run(["openssl", *argv], cwd=folder, capture_output=True, check=True, timeout=60)


def _make_ca(folder: Path, name: str) -> None:
    _openssl(folder, "req", "-x509", "-config", "tls.cnf", "-extensions", "ca", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-noenc", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days",
             "2", "-subj", f"/CN=hostedrooms test {name}")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server certificate it signed for 127.0.0.1 and localhost, and an unrelated CA (the recipe of
    docs/standby.md, with openssl: in Debian's base system and on CI runners)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    folder = tmp_path_factory.mktemp("tls")
    (folder / "tls.cnf").write_text(_TLS_CONFIG)
    _make_ca(folder, "ca")
    _make_ca(folder, "other-ca")
    _openssl(folder, "req", "-new", "-config", "tls.cnf", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-noenc", "-keyout", "server.key", "-out", "server.csr", "-subj",
             "/CN=localhost")
    _openssl(folder, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-set_serial",
             "2", "-days", "2", "-out", "server.pem", "-extfile", "tls.cnf", "-extensions", "server")
    return {name: str(folder / f"{name}.pem") for name in ("ca", "other-ca", "server")} | {
        "key": str(folder / "server.key")}


@sqlite_only
def test_tls_round_trip_and_a_client_refusing_an_unknown_ca(engine: Engine, token: str,
                                                            tls_files: dict[str, str]) -> None:
    host(engine, ROOM, 2)
    context = server_tls_context(tls_files["server"], tls_files["key"])
    with PageServer(EnginePageSource(engine), token=token, ssl_context=context) as server:
        assert server.url.startswith("https://127.0.0.1:")
        source = HttpPageSource(server.url, token=token, ssl_context=client_tls_context(tls_files["ca"]))
        try:
            assert [head.room_id for head in source.list_rooms()] == [ROOM]
            assert len(source.read_events(ROOM, since_seq=0, limit=10)["events"]) == 2
        finally:
            source.close()
        for refusing in (client_tls_context(tls_files["other-ca"]), None):  # None: the system's CAs
            source = HttpPageSource(server.url, token=token, ssl_context=refusing)
            try:
                with pytest.raises(SourceUnavailableError, match="SSLCertVerificationError"):
                    source.list_rooms()
            finally:
                source.close()
        # A client that connects and never starts its handshake holds its own thread, not the accept loop.
        silent = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        try:
            source = HttpPageSource(server.url, token=token, ssl_context=client_tls_context(tls_files["ca"]),
                                    timeout=10)
            try:
                assert [head.room_id for head in source.list_rooms()] == [ROOM]
            finally:
                source.close()
        finally:
            silent.close()
        # A plain-HTTP client gets nothing from a TLS server (and the server goes on serving).
        with pytest.raises((http.client.HTTPException, OSError)):
            _get(server.url.replace("https://", "http://"), "/rooms")
        source = HttpPageSource(server.url, token=token, ssl_context=client_tls_context(tls_files["ca"]))
        try:
            assert [head.room_id for head in source.list_rooms()] == [ROOM]
        finally:
            source.close()


@sqlite_only  # serve-pages on both backends: test_serve_pages_with_a_token_from_the_environment
def test_serve_pages_over_tls_to_replicate_with_a_ca_file(engine: Engine, target: str, standby_target: str,
                                                          token: str, token_file: Path, tls_files: dict[str, str],
                                                          served: list[_Served],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    host(engine, ROOM, 4)
    served.append(_Served(["--url", target, "--token-file", str(token_file), "--tls-cert", tls_files["server"],
                           "--tls-key", tls_files["key"]], _env()))
    line = served[0].first_line()
    url = line.split(" at ")[1].split(" (")[0]
    assert url.startswith("https://127.0.0.1:"), line
    code, out, _ = _run(capsys, "replicate", "--from", url, "--to", standby_target, "--token-file",
                          str(token_file))
    assert code == 1 and "SSLCertVerificationError" in out  # the system's CAs do not know the test CA
    code, out, _ = _run(capsys, "replicate", "--from", url, "--to", standby_target, "--token-file",
                        str(token_file), "--tls-ca", tls_files["ca"])
    assert code == 0 and out.startswith("replicate: 1 room (1 caught-up); 4 events")
    assert served[0].stop()[0] == 0


@sqlite_only
def test_serve_pages_option_errors(target: str, tls_files: dict[str, str], token_file: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "serve-pages", "--url", target, "--tls-cert", tls_files["server"])
    assert code == 1 and "--tls-cert and --tls-key go together" in err
    code, _, err = _run(capsys, "serve-pages", "--url", target, "--tls-cert", tls_files["ca"], "--tls-key",
                        tls_files["key"])
    assert code == 1 and "cannot load the TLS certificate" in err
    code, _, err = _run(capsys, "serve-pages", "--url", target, "--token-file", str(token_file),
                        "--insecure-no-token")
    assert code == 1 and "choose one" in err
    code, _, err = _run(capsys, "serve-pages", "--url", target, "--listen", "nowhere")
    assert code == 1 and "--listen must be HOST:PORT" in err
