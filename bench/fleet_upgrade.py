"""Upgrading a fleet (issue #37): one ``hostedrooms upgrade --schemas-from FILE`` over N schemas against N separate
``hostedrooms upgrade --schema NAME`` processes, on one PostgreSQL server.

    python bench/run.py --fleet-upgrade                          # 1,000 schemas, a throwaway cluster
    python bench/run.py --fleet-upgrade --schemas 200 --sample 20 --workers 4
    python bench/run.py --fleet-upgrade --url postgresql://admin:pw@host/postgres   # your server

Both sides run on the same server in the same run, each in a database of its own, on fresh schemas (not created
yet: each upgrade creates its schema, then runs every revision). The fleet command runs once over all N schemas
(``--workers`` at a time), timed from its process start to its exit, so its own start-up is counted. The
separate processes run one after the other, as a deploy script's loop would, on a sample of ``--sample`` schemas
(each timed from process start to exit); their total for N schemas is the sample's mean times N (extrapolated:
the report says so). Then the fleet command runs again over the same schemas, all at head now (what a resumed run
costs for the schemas it skips). Also reported: the fleet's per-schema migration time (from its own report) and the
separate processes' start-up (``hostedrooms --help``: Python start-up and imports, no database).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The console script beside this interpreter (as an operator runs it), else ``python -m hostedrooms.cli``.
_SCRIPT = Path(sys.executable).with_name("hostedrooms")
COMMAND = [str(_SCRIPT)] if _SCRIPT.is_file() else [sys.executable, "-m", "hostedrooms.cli"]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
    return time.perf_counter() - started, done


def _fleet(url: str, names: list[str], workers: int, folder: str) -> tuple[float, str]:
    listed = Path(folder) / "schemas.txt"
    listed.write_text("\n".join(names) + "\n")
    seconds, done = _timed([*COMMAND, "upgrade", "--url", url, "--schemas-from", str(listed),
                            "--workers", str(workers)])
    if done.returncode != 0:
        raise RuntimeError(f"fleet upgrade failed ({done.returncode}): {done.stderr[-2000:]}{done.stdout[-2000:]}")
    return seconds, done.stdout.splitlines()[-1]


def _separate(url: str, names: list[str]) -> list[float]:
    times = []
    for name in names:
        seconds, done = _timed([*COMMAND, "upgrade", "--url", url, "--schema", name])
        if done.returncode != 0:
            raise RuntimeError(f"upgrade --schema {name} failed: {done.stderr[-2000:]}")
        times.append(seconds)
    return times


def _start_up(samples: int = 5) -> float:
    return statistics.median(_timed([*COMMAND, "--help"])[0] for _ in range(samples))


def _server(url: str) -> str:
    from hostedrooms import testing

    with testing.open_engine(url) as engine, engine.connect() as connection:
        version = connection.exec_driver_sql("SHOW server_version").scalar()
        fsync = connection.exec_driver_sql("SHOW fsync").scalar()
    return f"PostgreSQL {version}, fsync={fsync}"


def run_fleet_upgrade(admin_url: str | None, *, schemas: int, sample: int, workers: int,
                      out: Any = sys.stdout) -> int:
    from hostedrooms import pgcluster, testing

    cluster = None
    try:
        if admin_url is None:
            cluster = pgcluster.start()
            admin_url = cluster.url
        names = [f"gw_{index:04}" for index in range(schemas)]
        sample = min(sample, schemas)
        with tempfile.TemporaryDirectory(prefix="hostedrooms-fleetup-") as folder, \
                testing.postgres_database(admin_url, testing.unique_name("bench_fleet")) as fleet_url, \
                testing.postgres_database(admin_url, testing.unique_name("bench_each")) as each_url:
            start_up = _start_up()
            _log(f"fleet-upgrade: {sample} separate processes ...")
            each = _separate(each_url, names[:sample])
            _log(f"fleet-upgrade: one command over {schemas} schemas, {workers} workers ...")
            fleet_seconds, summary = _fleet(fleet_url, names, workers, folder)
            _log("fleet-upgrade: the same command again (every schema at head) ...")
            rerun_seconds, rerun_summary = _fleet(fleet_url, names, workers, folder)
            server = _server(fleet_url)
        mean = statistics.fmean(each)
        extrapolated = mean * schemas
        rows = [
            (f"one command, --workers {workers}", f"{schemas:,}", f"{fleet_seconds:,.1f}",
             f"{fleet_seconds / schemas * 1000:,.0f}", "measured"),
            ("separate `hostedrooms upgrade` processes", f"{schemas:,}", f"{extrapolated:,.1f}",
             f"{mean * 1000:,.0f} (p50 {statistics.median(each) * 1000:,.0f})",
             f"extrapolated from {sample} run one after another"),
            (f"one command again, all at head, --workers {workers}", f"{schemas:,}", f"{rerun_seconds:,.1f}",
             f"{rerun_seconds / schemas * 1000:,.0f}", "measured (a resumed run's floor)"),
        ]
        out.write(f"# fleet upgrade, {time.strftime('%Y-%m-%d')}, {server}, {os.cpu_count()} cores, fresh schemas\n")
        out.write("| how | schemas | total s | ms per schema | note |\n|---|---|---|---|---|\n")
        for row in rows:
            out.write("| " + " | ".join(row) + " |\n")
        out.write(f"\nspeed-up: {extrapolated / fleet_seconds:.1f}x; a process's start-up alone (`hostedrooms "
                  f"--help`, median of 5): {start_up * 1000:.0f} ms\n")
        out.write(f"the fleet command said: {summary}\nagain: {rerun_summary}\n")
        return 0
    finally:
        if cluster is not None:
            cluster.stop()
