"""A throwaway PostgreSQL cluster for tests and benchmarks (Debian's ``postgresql`` package).

``python -m hostedrooms.pgcluster start DIR`` prints an admin URL; ``stop DIR`` stops and removes it;
``createdb ADMIN_URL NAME`` creates a database on it and prints its URL. The server
refuses to run as root, so as root it runs as the ``postgres`` user. Durability stays on (``fsync=on``,
``synchronous_commit=on``): tests and benchmarks see the commit costs users see.

:func:`start_pgbouncer` puts Debian's ``pgbouncer`` (when installed) in front of such a cluster, in transaction
pooling mode, for the pooler tests.

:func:`start_standby` adds a streaming hot standby to such a cluster (``pg_basebackup -R -X stream -C -S``, a
replication slot of its own, an ``application_name`` the primary can name in ``synchronous_standby_names``);
:meth:`Cluster.promote` promotes it, and :func:`multi_host_url` builds the libpq multi-host URL
(``target_session_attrs=read-write``) that finds whichever server is the primary, for the failover tests.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROLE = "hostedrooms"
PASSWORD = "hostedrooms"  # a throwaway cluster bound to 127.0.0.1; not a secret


def find_bin_dir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl`` (newest installed version), or None."""
    explicit = os.environ.get("HOSTEDROOMS_PG_BIN")
    candidates = [explicit] if explicit else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").is_file() and (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    return None


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit()) or (0,)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


@dataclass
class Cluster:
    """A running throwaway cluster."""

    directory: Path
    bin_dir: Path
    port: int

    @property
    def url(self) -> str:
        """An admin URL (role with CREATEDB) to the ``postgres`` database."""
        return f"postgresql+psycopg://{ROLE}:{PASSWORD}@127.0.0.1:{self.port}/postgres"

    def database_url(self, database: str) -> str:
        """The URL of ``database`` on this server (same role and password)."""
        return f"postgresql+psycopg://{ROLE}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        """Stop the server immediately and delete its files."""
        self.halt()
        shutil.rmtree(self.directory, ignore_errors=True)

    def halt(self, mode: str = "immediate") -> None:
        """Stop the server (``immediate``: as a crash would; ``fast``: a clean shutdown), keeping its files."""
        subprocess.run(
            _as_server_user([str(self.bin_dir / "pg_ctl"), "-D", str(self.directory / "data"), "-m", mode,
                             "-w", "stop"]),
            check=False, capture_output=True)

    def restart(self) -> None:
        """Start a halted server again on its own port and socket folder."""
        _run([str(self.bin_dir / "pg_ctl"), "-D", str(self.directory / "data"), "-o", _server_options(
            self.port, self.directory), "-l", str(self.directory / "server.log"), "-w", "-t", "60", "start"])
        _wait_ready(self)

    def promote(self) -> None:
        """Promote a standby to primary (``pg_ctl promote``, waiting until it accepts writes)."""
        _run([str(self.bin_dir / "pg_ctl"), "-D", str(self.directory / "data"), "-w", "-t", "60", "promote"])

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` through ``psql`` as the cluster's admin role; its unaligned output, stripped."""
        result = subprocess.run(
            [str(self.bin_dir / "psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
             str(self.port), "-U", ROLE, "-d", database, "-c", sql],
            capture_output=True, text=True, check=False, env={**os.environ, "PGPASSWORD": PASSWORD})
        if result.returncode != 0:
            raise RuntimeError(f"psql failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def wait_replayed(self, standby: Cluster, timeout: float = 60.0) -> None:
        """Wait until ``standby`` has replayed everything this primary has written so far (compares LSNs: a
        condition, not a guess)."""
        target = self.psql("SELECT pg_current_wal_insert_lsn()")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if standby.psql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn") == "t":
                return
            time.sleep(0.02)
        raise RuntimeError(f"the standby did not replay up to {target}")


def find_pgbouncer() -> Path | None:
    """The ``pgbouncer`` executable (Debian's package installs it in /usr/sbin), or None."""
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")
    return Path(found) if found else None


@dataclass
class Bouncer:
    """A running PgBouncer in front of a PostgreSQL server."""

    directory: Path
    port: int
    server_url: str

    def url(self, database: str) -> str:
        """The URL of ``database`` through the pooler (every database of the server is reachable)."""
        from sqlalchemy import make_url

        return make_url(self.server_url).set(host="127.0.0.1", port=self.port, database=database).render_as_string(
            hide_password=False)

    def stop(self) -> None:
        """Stop PgBouncer (the pid in its pidfile) and delete its files."""
        pidfile = self.directory / "pgbouncer.pid"
        deadline = time.monotonic() + 10
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int(pidfile.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            while time.monotonic() < deadline:
                os.kill(pid, 0)  # ProcessLookupError once it is gone
                time.sleep(0.05)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_pgbouncer(server_url: str, *, pool_mode: str = "transaction", default_pool_size: int = 4,
                    executable: Path | None = None) -> Bouncer:
    """Start PgBouncer on 127.0.0.1 and a free port before the server of ``server_url`` (a cluster's
    :attr:`Cluster.url`, or any URL with a host, port, role and password): ``pool_mode`` (transaction pooling by
    default), ``default_pool_size`` server connections per database and role, scram-sha-256 for the URL's role.
    Runs as the ``postgres`` user when root (as the server does)."""
    from sqlalchemy import make_url

    executable = executable or find_pgbouncer()
    if executable is None:
        raise RuntimeError("pgbouncer not found (apt-get install pgbouncer)")
    server = make_url(server_url)
    directory = Path(tempfile.mkdtemp(prefix="hostedrooms-pgbouncer-", dir="/tmp"))
    os.chmod(directory, 0o755)
    port = _free_port()
    (directory / "users.txt").write_text(f"{_auth_quote(server.username)} {_auth_quote(server.password)}\n")
    os.chmod(directory / "users.txt", 0o600)
    (directory / "pgbouncer.ini").write_text("\n".join([
        "[databases]", f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}", "",
        "[pgbouncer]", "listen_addr = 127.0.0.1", f"listen_port = {port}", "unix_socket_dir =",
        "auth_type = scram-sha-256", f"auth_file = {directory / 'users.txt'}", f"pool_mode = {pool_mode}",
        f"default_pool_size = {default_pool_size}", "max_client_conn = 1000", "server_reset_query =",
        "ignore_startup_parameters = extra_float_digits", f"logfile = {directory / 'pgbouncer.log'}",
        f"pidfile = {directory / 'pgbouncer.pid'}", ""]))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        for path in (directory, directory / "users.txt", directory / "pgbouncer.ini"):
            shutil.chown(path, "postgres")
    _run([str(executable), "-d", str(directory / "pgbouncer.ini")])
    bouncer = Bouncer(directory=directory, port=port, server_url=server_url)
    _wait_listening(bouncer)
    return bouncer


def _auth_quote(text: object) -> str:
    """A value as PgBouncer's auth_file quotes it (double quotes, doubled inside)."""
    return '"' + str(text).replace('"', '""') + '"'


def _wait_listening(bouncer: Bouncer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", bouncer.port), timeout=1):
            return
        time.sleep(0.05)
    log = bouncer.directory / "pgbouncer.log"
    detail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    bouncer.stop()
    raise RuntimeError(f"PgBouncer did not start listening: {detail}")


def start(directory: Path | None = None, *, bin_dir: Path | None = None) -> Cluster:
    """initdb and start a cluster on 127.0.0.1 with a free port; create the CREATEDB role."""
    bin_dir = bin_dir or find_bin_dir()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL server binaries not found (apt-get install postgresql)")
    # Not under pytest's 0700 temp dirs: the postgres user must be able to enter the folder.
    directory = Path(directory or tempfile.mkdtemp(prefix="hostedrooms-pg-", dir="/tmp"))
    directory.mkdir(parents=True, exist_ok=True)
    data, pwfile = directory / "data", directory / "pwfile"
    pwfile.write_text(PASSWORD + "\n")
    os.chmod(directory, 0o755)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        shutil.chown(directory, "postgres")
        shutil.chown(pwfile, "postgres")
    _run([str(bin_dir / "initdb"), "-D", str(data), "-U", ROLE, f"--pwfile={pwfile}", "-A", "scram-sha-256",
          "--auth-local=trust", "-E", "UTF8", "--locale=C.UTF-8"])
    port = _free_port()
    _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-o", _server_options(port, directory), "-l",
          str(directory / "server.log"), "-w", "-t", "60", "start"])
    cluster = Cluster(directory=directory, bin_dir=bin_dir, port=port)
    _wait_ready(cluster)
    return cluster


def _server_options(port: int, directory: Path) -> str:
    # wal_level, max_wal_senders and hot_standby are PostgreSQL's defaults, spelled out: a standby needs them.
    return (f"-c listen_addresses=127.0.0.1 -p {port} -k {directory} -c fsync=on -c synchronous_commit=on "
            "-c max_connections=200 -c shared_buffers=128MB -c wal_level=replica -c max_wal_senders=10 "
            "-c hot_standby=on")


def start_standby(primary: Cluster, name: str = "standby1", *, synchronous: bool = False) -> Cluster:
    """A streaming hot standby of ``primary`` on a free port: ``pg_basebackup -R -X stream -C -S NAME`` (a
    replication slot of its own, so the primary keeps the WAL it has not received), ``application_name=NAME``
    in its ``primary_conninfo``. ``synchronous``: the primary then names it in ``synchronous_standby_names``
    (with ``synchronous_commit=on``, a commit is acknowledged only once the standby has flushed it).
    ``name``: letters, digits and ``_``."""
    if not name.replace("_", "").isalnum():
        raise ValueError("a standby name is letters, digits and _")
    directory = Path(tempfile.mkdtemp(prefix="hostedrooms-pg-", dir="/tmp"))
    os.chmod(directory, 0o755)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        shutil.chown(directory, "postgres")
    conninfo = (f"host=127.0.0.1 port={primary.port} user={ROLE} password={PASSWORD} "
                f"application_name={name}")
    data = directory / "data"
    # --checkpoint=fast: the default spreads the backup's checkpoint over minutes when buffers are dirty.
    _run([str(primary.bin_dir / "pg_basebackup"), "-d", conninfo, "-D", str(data), "-R", "-X", "stream",
          "-C", "-S", name, "--checkpoint=fast"])
    with open(data / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
        conf.write(f"primary_conninfo = '{conninfo}'\n")
    port = _free_port()
    standby = Cluster(directory=directory, bin_dir=primary.bin_dir, port=port)
    standby.restart()
    if synchronous:
        primary.psql(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'")
        primary.psql("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 60
        while primary.psql("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") == "0":
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not become synchronous")
            time.sleep(0.02)
    return standby


@dataclass
class StandbyPair:
    """A primary and its streaming standby, both holding ``database``."""

    primary: Cluster
    standby: Cluster
    database: str

    @property
    def primary_url(self) -> str:
        return self.primary.database_url(self.database)

    @property
    def standby_url(self) -> str:
        return self.standby.database_url(self.database)

    @property
    def url(self) -> str:
        """The multi-host URL over both servers (whichever is the primary)."""
        return multi_host_url(self.database, self.primary, self.standby)

    def stop(self) -> None:
        """Stop both servers and delete their files."""
        self.standby.stop()
        self.primary.stop()


def start_pair(database: str = "hostedrooms_ha", *, synchronous: bool = False,
               prepare: Callable[[str], None] | None = None, bin_dir: Path | None = None) -> StandbyPair:
    """A new cluster holding ``database`` (first given to ``prepare(url)``, say to migrate it) and a streaming
    standby of it (:func:`start_standby`)."""
    if not database.replace("_", "").isalnum():
        raise ValueError("a database name here is letters, digits and _")
    primary = start(bin_dir=bin_dir)
    try:
        primary.psql(f"CREATE DATABASE {database}")
        if prepare is not None:
            prepare(primary.database_url(database))
        standby = start_standby(primary, synchronous=synchronous)
    except BaseException:
        primary.stop()
        raise
    return StandbyPair(primary, standby, database)


def multi_host_url(database: str, *servers: Cluster) -> str:
    """A libpq multi-host URL of ``database`` over ``servers`` that connects to whichever is the primary
    (``target_session_attrs=read-write``): what a fleet's gateways use to follow a failover."""
    hosts = ",".join(f"127.0.0.1:{server.port}" for server in servers)
    return (f"postgresql+psycopg://{ROLE}:{PASSWORD}@/{database}?host={hosts}"
            "&target_session_attrs=read-write")


def _run(argv: list[str]) -> None:
    result = subprocess.run(_as_server_user(argv), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed: {result.stderr.strip() or result.stdout.strip()}")


def _wait_ready(cluster: Cluster, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = subprocess.run(
            [str(cluster.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(cluster.port)],
            capture_output=True, check=False)
        if ready.returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("PostgreSQL did not become ready")


def main(argv: list[str]) -> int:
    """``start [DIR]`` prints the admin URL; ``stop DIR`` stops it; ``createdb ADMIN_URL NAME`` prints the URL of
    a new (or recreated, if it existed) database NAME on that server."""
    if len(argv) >= 1 and argv[0] == "start":
        cluster = start(Path(argv[1]) if len(argv) > 1 else None)
        (cluster.directory / "url").write_text(cluster.url)
        print(cluster.url)
        return 0
    if len(argv) == 2 and argv[0] == "stop":
        directory = Path(argv[1])
        bin_dir = find_bin_dir()
        if bin_dir is not None and (directory / "data").exists():
            Cluster(directory, bin_dir, 0).stop()
        return 0
    if len(argv) == 3 and argv[0] == "createdb":
        from .testing import create_database

        print(create_database(argv[1], argv[2]))
        return 0
    print("usage: python -m hostedrooms.pgcluster start [DIR] | stop DIR | createdb ADMIN_URL NAME", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
