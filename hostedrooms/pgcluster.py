"""A throwaway PostgreSQL cluster for tests and benchmarks (Debian's ``postgresql`` package).

``python -m hostedrooms.pgcluster start DIR`` prints an admin URL; ``stop DIR`` stops and removes it;
``createdb ADMIN_URL NAME`` creates a database on it and prints its URL. The server
refuses to run as root, so as root it runs as the ``postgres`` user. Durability stays on (``fsync=on``,
``synchronous_commit=on``): tests and benchmarks see the commit costs users see.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
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

    def stop(self) -> None:
        """Stop the server immediately and delete its files."""
        subprocess.run(
            _as_server_user([str(self.bin_dir / "pg_ctl"), "-D", str(self.directory / "data"), "-m", "immediate",
                             "-w", "stop"]),
            check=False, capture_output=True)
        shutil.rmtree(self.directory, ignore_errors=True)


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
    options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {directory} -c fsync=on -c synchronous_commit=on "
               "-c max_connections=200 -c shared_buffers=128MB")
    _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(directory / "server.log"), "-w",
          "-t", "60", "start"])
    cluster = Cluster(directory=directory, bin_dir=bin_dir, port=port)
    _wait_ready(cluster)
    return cluster


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
