"""hostedrooms benchmarks: each workload in a fresh process, with a raw-driver baseline in the same run.

    python bench/run.py                       # SQLite file in a temp folder, synchronous=FULL
    python bench/run.py --synchronous NORMAL  # the documented opt-in (reported as such)
    python bench/run.py --url postgresql://user:pw@127.0.0.1/postgres   # an admin URL: databases are created
    python bench/run.py --postgres            # start a throwaway PostgreSQL cluster for the run
    python bench/run.py --quick               # smaller counts (a smoke run)
    python bench/run.py --compare read        # hostedrooms beside its peers, alternating rounds (bench/compare.py)
    python bench/run.py --fleet               # N gateways x W writers on one PostgreSQL: schema/database per
                                              # gateway, direct and through PgBouncer (bench/fleet.py)
    python bench/run.py --fleet-upgrade       # one `hostedrooms upgrade --schemas-from` over 1,000 fresh schemas vs
                                              # separate processes (bench/fleet_upgrade.py)
    python bench/run.py --scale [--postgres]  # latency curves as logs, rooms and payloads grow (bench/scale.py)
    python bench/run.py --telemetry-overhead  # OpenTelemetry on vs off (bench/telemetry_overhead.py)
    python bench/run.py --ledger --reference ../shared/reference   # the delivery ledger beside the reference
                                              # implementation, operation by operation (bench/ledger.py)

Prints a table: workload, dialect, synchronous mode, batch size, operations, rate, p50/p99 latency, peak
memory (the worker process's max RSS), and the ratio to the raw-driver baseline where it applies. Absolute
figures on shared machines are noisy: quote the ratios, measured in one run, with the conditions.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# bench/ is a package; `python bench/run.py` puts only bench/ itself on the path, hence the insert above.
from bench.common import Result, Setup  # noqa: E402
from bench.common import raise_limits as _raise_limits  # noqa: E402
from bench.registry import POSTGRES_WORKLOADS, SQLITE_ONLY, WORKLOADS, run  # noqa: E402


def _print(results: list[Result], dialect: str, synchronous: str, out: Any = sys.stdout) -> None:
    baseline = next((result.rate for result in results if result.workload.startswith("raw-driver append")), None)
    single = next((result.rate for result in results if result.workload == "append_event, empty database"), None)
    one_writer = next((result.rate for result in results if result.workload.startswith("1 writer")), None)
    raw_one_writer = next((result.rate for result in results if result.workload.startswith("raw-driver, 1 writer")),
                          None)
    header = ("workload", "dialect", "sync", "batch", "ops", "events/s", "p50 ms", "p99 ms", "peak MB",
              "vs raw", "vs single", "note")
    rows = []
    for result in results:
        vs_raw = f"{result.rate / baseline:.2f}x" if baseline and result.batch == 1 and "writer" not in \
            result.workload and "ledger" not in result.workload else ""
        floor = next((r.rate for r in results if r.workload.startswith("raw-driver append, hostedrooms")), None)
        if floor and result.workload.startswith("append_event"):
            vs_raw += f" ({result.rate / floor:.2f}x own)"
        vs_single = ""
        if single and result.workload.startswith("append") and result.workload != "append_event, empty database":
            vs_single = f"{result.rate / single:.2f}x"
        writers_base = raw_one_writer if result.workload.startswith("raw-driver, ") else one_writer
        if writers_base and "writer" in result.workload:
            vs_single = f"{result.rate / writers_base:.2f}x (vs 1 writer)"
        rows.append((result.workload, dialect, synchronous if dialect == "sqlite" else "fsync=on",
                     str(result.batch), str(result.operations), f"{result.rate:,.0f}",
                     f"{result.percentile(0.5) * 1000:.2f}", f"{result.percentile(0.99) * 1000:.2f}",
                     f"{result.peak_rss_kb / 1024:.0f}", vs_raw, vs_single, result.note))
    widths = [max(len(row[index]) for row in [header, *rows]) for index in range(len(header))]
    out.write("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |\n")
    out.write("|" + "|".join("-" * (w + 2) for w in widths) + "|\n")
    for row in rows:
        out.write("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |\n")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="PostgreSQL admin URL (a role that may CREATE DATABASE)")
    parser.add_argument("--postgres", action="store_true", help="start a throwaway PostgreSQL cluster")
    parser.add_argument("--synchronous", default="FULL", choices=("FULL", "NORMAL"), help="SQLite only")
    parser.add_argument("--quick", action="store_true", help="small counts")
    parser.add_argument("--workloads", help="comma-separated subset: " + ", ".join(
        [*WORKLOADS, *POSTGRES_WORKLOADS]))
    parser.add_argument("--compare", metavar="WORKLOADS",
                        help="comparison mode: hostedrooms beside its peers in alternating rounds, for these "
                             "comma-separated workloads (read, append, batch100, catch-up, or all); "
                             "see bench/compare.py")
    parser.add_argument("--rounds", type=int, default=None, help="comparison and fleet rounds (default 5; "
                                                                  "--fleet: 4, with --quick 2)")
    parser.add_argument("--scale", action="store_true",
                        help="scale curves (events per room, rooms, payload sizes, follow, standby lag); with "
                             "--postgres or --url on PostgreSQL; see bench/scale.py")
    parser.add_argument("--max-events", type=int, default=100_000,
                        help="--scale: largest room in events (default 100,000; 1,000,000 for the documented run)")
    parser.add_argument("--fleet", action="store_true",
                        help="fleet comparison on PostgreSQL (--url, else a throwaway cluster); see bench/fleet.py")
    parser.add_argument("--gateways", type=int, default=None, help="--fleet: gateways (default 4, --quick 2)")
    parser.add_argument("--writers", type=int, default=None,
                        help="--fleet: writer processes per gateway (default 2)")
    parser.add_argument("--appends", type=int, default=None,
                        help="--fleet: calls per writer per round (default 200, --quick 40)")
    parser.add_argument("--batch", type=int, default=1, help="--fleet: events per call (default 1: append_event)")
    parser.add_argument("--pool-size", type=int, default=None,
                        help="--fleet: PgBouncer server connections per gateway (default: --writers)")
    parser.add_argument("--layouts", default=None,
                        help="--fleet: comma-separated layouts to run (default: schema-direct, schema-pgbouncer, "
                             "database-direct, schema-direct-unprepared; also schema-pgbouncer-unheld)")
    parser.add_argument("--fleet-upgrade", action="store_true",
                        help="one fleet upgrade vs separate upgrade processes on PostgreSQL (--url, else a throwaway "
                             "cluster); see bench/fleet_upgrade.py")
    parser.add_argument("--schemas", type=int, default=1000, help="--fleet-upgrade: schemas (default 1,000)")
    parser.add_argument("--sample", type=int, default=50,
                        help="--fleet-upgrade: separate processes actually run (default 50; extrapolated)")
    parser.add_argument("--workers", type=int, default=4, help="--fleet-upgrade: the command's --workers (4)")
    parser.add_argument("--contenders", help="comparison contenders besides hostedrooms, comma-separated "
                                             "(default: all that apply; see bench/contenders/)")
    parser.add_argument("--telemetry-overhead", action="store_true",
                        help="single durable appends with the OpenTelemetry instrumentation on and off, in "
                             "alternating rounds (--rounds, default 5; SQLite; bench/telemetry_overhead.py)")
    parser.add_argument("--ledger", action="store_true",
                        help="the delivery ledger beside the reference, operation by operation (--rounds, default "
                             "5; SQLite; bench/ledger.py); needs --reference")
    parser.add_argument("--reference", metavar="DIR",
                        help="--ledger: the folder holding the reference's secure_peer_delivery.py")
    parser.add_argument("--impl", choices=("facade", "ledger"), default="facade",
                        help="--ledger: hostedrooms through its reference-shaped facade (default) or DeliveryLedger")
    parser.add_argument("--cycles", type=int, default=None, help="--ledger: delivery cycles per round (default 150)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    alone = _run_alone(parser, args)
    if alone is not None:
        return alone
    cluster = None
    url = args.url
    if args.postgres:
        from hostedrooms import pgcluster

        cluster = pgcluster.start()
        url = cluster.url
    if args.compare:
        return _compare(args, url, cluster)
    if args.scale:
        return _scale(args, url, cluster)
    return _workloads(args, url, cluster)


def _run_alone(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int | None:
    """The runs that start no cluster of their own here (--ledger, --telemetry-overhead, --fleet), after the
    checks of the options every run shares; None: go on with the workloads, --compare or --scale."""
    if args.ledger:
        from bench.ledger import run_ledger

        if not args.reference:
            parser.error("--ledger needs --reference DIR (the reference implementation is not part of hostedrooms)")
        return run_ledger(reference=args.reference, impl=args.impl, rounds=args.rounds or 5,
                          cycles=args.cycles or (30 if args.quick else 150), warm=10)
    if args.telemetry_overhead:
        from bench.telemetry_overhead import run_overhead

        _raise_limits()
        return run_overhead(synchronous=args.synchronous, rounds=args.rounds, per_round=50 if args.quick else 200)
    if args.fleet_upgrade:
        from bench.fleet_upgrade import run_fleet_upgrade

        return run_fleet_upgrade(args.url, schemas=args.schemas, sample=args.sample, workers=args.workers)
    if args.compare and args.workloads:
        parser.error("--workloads picks bench/run.py's workloads; --compare names comparison workloads")
    if args.rounds is None:
        args.rounds = (2 if args.quick else 4) if args.fleet else 5  # fleet: each layout takes each place
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.fleet:
        from bench.fleet import ALL_LAYOUTS, LAYOUTS, run_fleet

        if args.postgres or args.compare or args.workloads:
            parser.error("--fleet runs on its own (on --url, else on a throwaway cluster it starts)")
        chosen = tuple(name.strip() for name in args.layouts.split(",")) if args.layouts else LAYOUTS
        unknown = [name for name in chosen if name not in ALL_LAYOUTS]
        if unknown or not chosen or len(set(chosen)) != len(chosen):
            parser.error(f"--layouts: each of {', '.join(ALL_LAYOUTS)} at most once (got {args.layouts!r})")
        return run_fleet(args.url, gateways=args.gateways or (2 if args.quick else 4), writers=args.writers or 2,
                         calls=args.appends or (40 if args.quick else 200), batch=args.batch, rounds=args.rounds,
                         pool_size=args.pool_size, quick=args.quick, chosen=chosen)
    return None


def _workloads(args: argparse.Namespace, url: str | None, cluster: Any) -> int:
    names = [name for name in WORKLOADS if not url or name not in SQLITE_ONLY]
    names += list(POSTGRES_WORKLOADS) if url else []
    if args.workloads:
        names = [name for name in args.workloads.split(",") if name]
    dialect = "postgresql" if url else "sqlite"
    results: list[Result] = []
    try:
        with tempfile.TemporaryDirectory(prefix="hostedrooms-bench-") as folder:
            setup = Setup(url=url, folder=folder, synchronous=args.synchronous, quick=args.quick)
            for name in names:
                print(f"running {name} ...", file=sys.stderr, flush=True)
                results.append(run(name, setup))
    finally:
        if cluster is not None:
            cluster.stop()
    print(f"# hostedrooms benchmark, {time.strftime('%Y-%m-%d')}, {dialect}, {os.cpu_count()} cores")
    _print(results, dialect, args.synchronous)
    return 0


def _scale(args: argparse.Namespace, url: str | None, cluster: Any) -> int:
    from bench.common import Context
    from bench.scale import run_scale

    try:
        with tempfile.TemporaryDirectory(prefix="hostedrooms-scale-") as folder:
            context = Context(url=url, folder=folder, synchronous=args.synchronous, quick=args.quick)
            return run_scale(context, max_events=args.max_events)
    finally:
        if cluster is not None:
            cluster.stop()


def _compare(args: argparse.Namespace, url: str | None, cluster: Any) -> int:
    from bench.common import Context
    from bench.compare import run_comparisons

    contenders = [name for name in args.contenders.split(",") if name] if args.contenders else None
    try:
        with tempfile.TemporaryDirectory(prefix="hostedrooms-compare-") as folder:
            context = Context(url=url, folder=folder, synchronous=args.synchronous, quick=args.quick)
            return run_comparisons([name for name in args.compare.split(",") if name], context, args.rounds,
                                   contenders)
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main())
