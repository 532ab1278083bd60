"""Fleet comparison (issue #26 item 8): N gateways x W writer processes each, on one PostgreSQL server.

    python bench/run.py --fleet                        # starts a throwaway cluster and a PgBouncer
    python bench/run.py --fleet --gateways 4 --writers 2 --appends 200 --rounds 5
    python bench/run.py --fleet --url postgresql://admin:pw@host/postgres   # your server (PgBouncer runs here)
    python bench/run.py --fleet --quick                # a smoke run
    python bench/run.py --fleet --layouts schema-direct,schema-pgbouncer,schema-pgbouncer-unheld --appends 1000

The layouts of the same gateways:

- **schema, direct**: one database, a schema per gateway (``create_engine(url, schema="gwNN")``);
- **schema, PgBouncer**: the same database and schemas through PgBouncer in transaction mode, started with
  ``pgcluster.start_pgbouncer``. ``schema=`` is refused under transaction pooling (a ``search_path`` is session
  state), so each gateway gets a PgBouncer database alias of its own whose ``connect_query`` sets its schema:
  every server connection of that alias's pool stays in that schema, and the engine (``pooler="transaction"``,
  ``listen_url`` direct) takes its namespace from the first connection's ``current_schema()``;
- **database, direct**: a database per gateway (the contrast the targets are set against);
- **schema, direct, unprepared**: the first layout with psycopg's ``prepare_threshold=None``, as under transaction
  pooling: PgBouncer over this one is the cost of the pooler's hop alone, this one over the first the cost of
  parsing and planning every statement again;
- **schema, PgBouncer, unheld** (only when ``--layouts`` names it): the PgBouncer layout with
  ``held_connections=0``, every single append taking a pooled connection: the PgBouncer layout over this one is
  what the held client connections to the pooler bring, measured in the same rounds.

``--layouts`` runs a subset (comma-separated names, in the order given; default the first four); a ratio is
reported when both of its layouts ran. ``--appends`` sets the round's length (200 calls per writer by default:
short rounds, noisy on a shared machine; 1,000 or more give steadier ratios).

Every writer is its own process (as gateways are), with a pool of one connection, appending to a room of its own
(single appends, or ``--batch`` events per ``append_events``). Every round runs each layout once, in an order
rotated by one place per round; each layout's writers connect and warm up, then start together. Per layout:
appends/s (events/s with batches) over the round's wall time, p50/p99 of the calls' latencies; the ratios
schema/database (target >= 0.9) and PgBouncer/direct (target >= 0.9, issue #36) are computed per round, then the
median and the min-max over the rounds.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from bench.common import ACTOR, GATEWAY, KIND, PAYLOAD, postgres_connect, render

LAYOUTS = ("schema-direct", "schema-pgbouncer", "database-direct", "schema-direct-unprepared")
#: Every layout ``--layouts`` may name (the default runs :data:`LAYOUTS`).
ALL_LAYOUTS = (*LAYOUTS, "schema-pgbouncer-unheld")
LABELS = {"schema-direct": "schema per gateway, direct",
          "schema-pgbouncer": "schema per gateway, PgBouncer (transaction)",
          "database-direct": "database per gateway, direct",
          "schema-direct-unprepared": "schema per gateway, direct, no server-side prepares",
          "schema-pgbouncer-unheld": "schema per gateway, PgBouncer (transaction), held_connections=0"}


@dataclass(frozen=True)
class Gateway:
    """How one gateway's writers reach their store: ``create_engine(url, **options)``."""

    name: str
    url: str
    options: tuple[tuple[str, Any], ...] = ()


@dataclass
class Sample:
    events: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


# --- worker processes ----------------------------------------------------------------------------------------


def _writer(gateway: Gateway, room_id: str, prefix: str, calls: int, batch: int, queue: Any, ready: Any,
            go: Any) -> None:
    from hostedrooms import create_engine, rooms

    try:
        engine = create_engine(gateway.url, pool_size=1, max_overflow=0, **dict(gateway.options))
        rooms.room_state(engine, room_id=room_id)  # connected and warm before the clock starts

        def call(index: int) -> None:
            if batch == 1:
                rooms.append_event(engine, room_id=room_id, event_id=f"{prefix}-{index}", kind=KIND, actor=ACTOR,
                                   payload=PAYLOAD, authority_gateway_id=GATEWAY, authority_epoch=1)
            else:
                rooms.append_events(engine, room_id, [
                    {"event_id": f"{prefix}-{index}-{item}", "kind": KIND, "actor": ACTOR, "payload": PAYLOAD}
                    for item in range(batch)], GATEWAY, 1)

        call(-1)
    except BaseException as error:  # the parent reports it instead of waiting forever
        ready.release()
        queue.put(("error", repr(error)))
        return
    ready.release()
    go.wait()
    latencies: list[float] = []
    started = time.perf_counter()
    for index in range(calls):
        begun = time.perf_counter()
        call(index)
        latencies.append(time.perf_counter() - begun)
    finished = time.perf_counter()
    engine.dispose()
    queue.put(("ok", (started, finished, latencies)))


def _round(gateways: list[Gateway], writers: int, calls: int, batch: int, round_index: int) -> Sample:
    """Every gateway's writers at once, started together; one Sample for the whole fleet."""
    from hostedrooms import create_engine, rooms

    tag = f"r{round_index}-{uuid.uuid4().hex[:4]}"
    for gateway in gateways:  # a fresh room per writer each round: every layout starts each round alike
        engine = create_engine(gateway.url, **dict(gateway.options))
        for writer in range(writers):
            rooms.create_room(engine, room_id=f"{tag}-w{writer}", name="fleet", members=[],
                              authority_gateway_id=GATEWAY)
        engine.dispose()
    context = multiprocessing.get_context("spawn")
    queue, ready, go = context.Queue(), context.Semaphore(0), context.Event()
    processes = [context.Process(target=_writer, args=(gateway, f"{tag}-w{writer}", f"{gateway.name}-{writer}",
                                                       calls, batch, queue, ready, go))
                 for gateway in gateways for writer in range(writers)]
    for process in processes:
        process.start()
    for _ in processes:
        ready.acquire()
    go.set()
    spans, latencies, errors = [], [], []
    for _ in processes:
        status, value = queue.get(timeout=600)
        if status != "ok":
            errors.append(value)
            continue
        started, finished, own = value
        spans.append((started, finished))
        latencies.extend(own)
    for process in processes:
        process.join()
    if errors:
        raise RuntimeError(f"{len(errors)} writer(s) failed: {errors[0]}")
    seconds = max(end for _, end in spans) - min(start for start, _ in spans)
    return Sample(len(latencies) * batch, seconds, latencies)


# --- the layouts -------------------------------------------------------------------------------------------------


def _database_url(admin_url: str, database: str, **query: str) -> str:
    from sqlalchemy import make_url

    url = make_url(admin_url).set(database=database)
    if query:
        url = url.update_query_dict(query)
    return url.render_as_string(hide_password=False)


def _alias_bouncer(bouncer: Any, aliases: dict[str, tuple[str, str]]) -> None:
    """Add a database alias per gateway to a running PgBouncer (``alias = dbname=... connect_query=SET
    search_path ...``) and reload it: each alias has its own pool of server connections, all in its schema."""
    from sqlalchemy import make_url

    server = make_url(bouncer.server_url)
    ini = bouncer.directory / "pgbouncer.ini"
    lines = [f"{alias} = host={server.host or '127.0.0.1'} port={server.port or 5432} dbname={database} "
             f"connect_query='SET search_path TO {schema}'" for alias, (database, schema) in aliases.items()]
    text = ini.read_text().replace("[databases]\n", "[databases]\n" + "\n".join(lines) + "\n", 1)
    ini.write_text(text)
    os.kill(int((bouncer.directory / "pgbouncer.pid").read_text().strip()), signal.SIGHUP)
    time.sleep(1.0)  # the reload is asynchronous; a connection before it would reach the wildcard entry


def prepare(admin_url: str, gateways: int, bouncer: Any, created: list[str]) -> dict[str, list[Gateway]]:
    """Create and migrate every layout's stores (their database names appended to ``created``); return each
    layout's gateways."""
    from hostedrooms import migrate
    from hostedrooms.testing import create_database

    suffix = uuid.uuid4().hex[:6]
    shared = create_database(admin_url, f"bench_fleet_{suffix}")
    names = [f"gw{index:02}" for index in range(gateways)]
    layouts: dict[str, list[Gateway]] = {layout: [] for layout in ALL_LAYOUTS}
    aliases: dict[str, tuple[str, str]] = {}
    from sqlalchemy import make_url

    shared_name = str(make_url(shared).database)
    created.append(shared_name)
    for name in names:
        migrate.upgrade(shared, schema=name)
        layouts["schema-direct"].append(Gateway(name, shared, (("schema", name),)))
        layouts["schema-direct-unprepared"].append(Gateway(name, shared, (
            ("schema", name), ("connect_args", {"prepare_threshold": None}))))
        aliases[f"{shared_name}_{name}"] = (shared_name, name)
        own = create_database(admin_url, f"bench_fleet_{suffix}_{name}")
        created.append(str(make_url(own).database))
        migrate.upgrade(own)
        layouts["database-direct"].append(Gateway(name, own))
    _alias_bouncer(bouncer, aliases)
    for name in names:
        listen = _database_url(admin_url, shared_name, options=f"-csearch_path={name}")
        layouts["schema-pgbouncer"].append(Gateway(name, bouncer.url(f"{shared_name}_{name}"), (
            ("pooler", "transaction"), ("listen_url", listen))))
        layouts["schema-pgbouncer-unheld"].append(Gateway(name, bouncer.url(f"{shared_name}_{name}"), (
            ("pooler", "transaction"), ("listen_url", listen), ("held_connections", 0))))
    return layouts


def _check_schemas(layouts: dict[str, list[Gateway]]) -> None:
    """Each PgBouncer gateway's connections are in its own schema (the alias's connect_query took effect), where
    its appends find their server-side function (revision 0011: the pooled engines call it)."""
    from sqlalchemy import text

    from hostedrooms import create_engine

    for gateway in layouts["schema-pgbouncer"]:
        engine = create_engine(gateway.url, **dict(gateway.options))
        with engine.connect() as connection:
            current, function = connection.execute(text(
                "SELECT current_schema(), CAST(to_regproc('hostedrooms_append_one') AS oid) <> 0")).one()
        engine.dispose()
        if current != gateway.name or not function:
            raise RuntimeError(f"PgBouncer alias of {gateway.name} runs in schema {current} (append function "
                               f"{'found' if function else 'missing'})")


def _settings(admin_url: str) -> dict[str, str]:
    connection = postgres_connect(admin_url)
    try:
        return {name: str(connection.execute(f"SHOW {name}").fetchone()[0])
                for name in ("server_version", "fsync", "synchronous_commit", "max_connections")}
    finally:
        connection.close()


# --- the run and the report --------------------------------------------------------------------------------------


def _median_range(values: list[float], digits: str, unit: str = "") -> str:
    if not values:
        return ""
    return f"{statistics.median(values):{digits}}{unit} ({min(values):{digits}}-{max(values):{digits}})"


def run_fleet(admin_url: str | None, *, gateways: int, writers: int, calls: int, batch: int, rounds: int,
              pool_size: int | None, quick: bool, chosen: tuple[str, ...] = LAYOUTS, out: Any = sys.stdout) -> int:
    from hostedrooms import pgcluster
    from hostedrooms.testing import drop_database

    cluster = None
    bouncer = None
    created: list[str] = []
    try:
        if admin_url is None:
            cluster = pgcluster.start()
            admin_url = cluster.url
        server_pool = pool_size or writers
        bouncer = pgcluster.start_pgbouncer(admin_url, pool_mode="transaction", default_pool_size=server_pool)
        _log(f"fleet: preparing {gateways} gateways in {len(chosen)} layouts")
        layouts = prepare(admin_url, gateways, bouncer, created)
        _check_schemas(layouts)
        samples: dict[str, list[Sample]] = {layout: [] for layout in chosen}
        for round_index in range(rounds):
            order = list(chosen[round_index % len(chosen):] + chosen[:round_index % len(chosen)])
            for layout in order:
                _log(f"fleet: round {round_index + 1}/{rounds}, {layout}")
                samples[layout].append(_round(layouts[layout], writers, calls, batch, round_index))
        settings = _settings(admin_url)
        report(samples, settings, gateways=gateways, writers=writers, calls=calls, batch=batch, rounds=rounds,
               server_pool=server_pool, quick=quick, out=out)
    finally:
        if bouncer is not None:
            bouncer.stop()
        if cluster is not None:
            cluster.stop()
        elif admin_url is not None:  # the caller's server: leave nothing behind
            for name in created:
                drop_database(admin_url, name)
    return 0


def report(samples: dict[str, list[Sample]], settings: dict[str, str], *, gateways: int, writers: int, calls: int,
           batch: int, rounds: int, server_pool: int, quick: bool, out: Any) -> None:
    unit = "appends/s" if batch == 1 else "events/s"
    out.write(f"### fleet: {gateways} gateways x {writers} writer processes, {calls} "
              f"{'appends' if batch == 1 else f'batches of {batch}'} each per round\n\n"
              f"PostgreSQL {settings['server_version'].split()[0]} (fsync={settings['fsync']}, synchronous_commit="
              f"{settings['synchronous_commit']}, max_connections={settings['max_connections']}); batch size "
              f"{batch}; each writer a process with a pool of 1 connection (pool_size=1, max_overflow=0), its "
              f"own room; PgBouncer transaction mode, default_pool_size={server_pool} per gateway alias "
              f"({gateways * server_pool} server connections for {gateways * writers} clients); {rounds} rounds, "
              f"layout order rotated each round; {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load "
              f"average {os.getloadavg()[0]:.1f} at the end{', --quick' if quick else ''}\n\n")
    rows = [("layout", f"{unit} (median, min-max)", "p50 ms (median)", "p99 ms (median, min-max)")]
    for layout in samples:
        rates = [sample.rate for sample in samples[layout]]
        p50 = [sample.percentile(0.5) * 1000 for sample in samples[layout]]
        p99 = [sample.percentile(0.99) * 1000 for sample in samples[layout]]
        rows.append((LABELS[layout], _median_range(rates, ",.0f"), f"{statistics.median(p50):.2f}",
                     _median_range(p99, ".2f")))
    out.write(render(rows))

    def ratios(over: str, under: str) -> list[float]:
        if over not in samples or under not in samples:
            return []
        return [a.rate / b.rate for a, b in zip(samples[over], samples[under], strict=True) if b.rate]

    wanted = [
        ("schema per gateway / database per gateway (direct)", "schema-direct", "database-direct", ">= 0.9x"),
        ("PgBouncer / direct (schema per gateway)", "schema-pgbouncer", "schema-direct", ">= 0.9x"),
        ("PgBouncer schemas / database per gateway direct", "schema-pgbouncer", "database-direct", ""),
        ("PgBouncer / direct without server prepares (the hop)", "schema-pgbouncer", "schema-direct-unprepared", ""),
        ("direct without / with server prepares", "schema-direct-unprepared", "schema-direct", ""),
        ("PgBouncer held / without held connections", "schema-pgbouncer", "schema-pgbouncer-unheld", ""),
        ("PgBouncer without held connections / direct", "schema-pgbouncer-unheld", "schema-direct", ""),
    ]
    measured = [(label, ratios(over, under), target) for label, over, under, target in wanted]
    out.write("\n" + render([("ratio (per round, then median and min-max)", "measured", "target"), *(
        (label, _median_range(values, ".2f", "x"), target) for label, values, target in measured if values)]))
    # Every round's PgBouncer ratios, for pooling rounds over several runs.
    per_round = [(label, values) for label, values, _ in measured if values and label.startswith("PgBouncer")
                 and (label.endswith("(schema per gateway)") or "held" in label)]
    out.write("".join(f"\nper round, {label}: {', '.join(f'{value:.3f}' for value in values)}"
                      for label, values in per_round) + "\n")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

