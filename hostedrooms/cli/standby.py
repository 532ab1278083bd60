"""The standby commands of the ``hostedrooms`` console script: ``replicate``, ``failover`` and ``serve-pages``,
each command's arguments beside its handler (see docs/standby.md); what they share first: the progress display,
the signal-safe stop flag, the page client's token and TLS options, and the ``--metrics`` server."""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import sqlalchemy as sa

from ..db import DATABASE_URL_ENV
from ..display import terminal_text
from ..errors import HostedRoomError, describe_target, redact
from ..migrate import SCHEMA_ENV
from .support import (
    DEFAULT_DATABASE,
    EXIT_FAILED,
    EXIT_OK,
    Command,
    Progress,
    default_url,
    engine_of,
    non_negative_int,
    positive_int,
    require_schema,
)

_log = logging.getLogger("hostedrooms.cli")  # the console script's one logger, whatever module logs


# --- shared ------------------------------------------------------------------------------------------------


def _seconds(value: float, option: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise HostedRoomError(f"{option} must be a finite number of seconds, 0 or more")
    return value


class _ReplicateDisplay:
    """The replicate command's output: a progress line on a terminal (rooms, events, lag), a line per refused or
    demoted room on stdout, and one summary line."""

    def __init__(self, out: TextIO, source: str) -> None:
        self.out, self.source = out, source
        self.progress = Progress()
        self.rooms = self.events = self.pages = self.passes = self.lag = 0

    def on_page(self, page: Any) -> None:
        self.events += page.events
        self.pages += 1
        self.progress(f"replicating from {self.source}: room {self.rooms + 1}, {self.events:,} events, "
                      f"lag {self.lag:,} events ...")

    def on_room(self, room: Any) -> None:
        from ..standby.reclaim import FENCED, RECLAIMED
        from ..standby.replicator import DEMOTED, REFUSED

        self.rooms += 1
        self.lag += room.lag
        if room.status in (REFUSED, DEMOTED, RECLAIMED, FENCED):
            self.progress.done()
            self.out.write(terminal_text(f"{room.status} {room.room_id}: {room.reason}") + "\n")
            self.out.flush()

    def on_pass(self, report: Any) -> None:
        self.passes += 1
        self.rooms, self.lag = 0, 0
        self.progress(f"replicating from {self.source}: {len(report.rooms)} rooms, {self.events:,} events "
                      f"so far, lag {report.lag:,} events" + (f"; {redact(report.error)}" if report.error else ""))


class SignalStop(threading.Event):
    """A stop flag a signal handler may set: :meth:`signal` only assigns an attribute.

    ``threading.Event.set`` takes the event's lock; a handler runs on the main thread between two bytecodes,
    possibly while that thread holds the same lock inside ``Event.wait`` (a following replicator waits on the
    event every few milliseconds), and would then wait for itself forever. Waits here poll the flag instead.
    """

    _POLL = 0.05

    def __init__(self) -> None:
        super().__init__()
        self.signalled = False

    def signal(self, *_: Any) -> None:
        """The handler: no lock, no allocation beyond the assignment."""
        self.signalled = True

    def is_set(self) -> bool:
        return self.signalled or super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            remaining = self._POLL if deadline is None else min(self._POLL, deadline - time.monotonic())
            if remaining <= 0:
                return False
            super().wait(remaining)
        return True


@contextmanager
def _stop_on_signals() -> Iterator[SignalStop]:
    """A stop flag set by SIGTERM or SIGINT while the block runs (the previous handlers come back)."""
    stop = SignalStop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {number: signal.signal(number, stop.signal) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _warn(message: str) -> None:
    """A warning an operator must see: on stderr, whatever the logging options (and logged)."""
    _log.warning("%s", message)
    sys.stderr.write(terminal_text(f"hostedrooms: WARNING: {message}") + "\n")
    sys.stderr.flush()


def _page_client_options(args: argparse.Namespace, spec: str | None) -> dict[str, Any]:
    """An http(s) page source's token (``--token-file``, else ``$HOSTEDROOMS_PAGE_TOKEN``) and TLS CA
    (``--tls-ca``); the options are refused where they would be ignored."""
    from ..standby.auth import client_tls_context, in_clear, resolve_token
    from ..standby.open import is_http_source

    if spec is None or not is_http_source(spec):
        if args.token_file is not None or args.tls_ca is not None:
            raise HostedRoomError("--token-file and --tls-ca apply to an http(s):// page source only")
        return {}
    if args.tls_ca is not None and not spec.startswith("https://"):
        raise HostedRoomError("--tls-ca needs an https:// page source")
    options: dict[str, Any] = {"token": resolve_token(args.token_file)}
    if options["token"] is not None and in_clear(spec):
        _warn(f"the page token is sent in clear to {describe_target(spec)}: use https://")
    if args.tls_ca is not None:
        options["ssl_context"] = client_tls_context(args.tls_ca)
    return options


def _standby_metrics(args: argparse.Namespace) -> Any:
    """The --metrics endpoint's metrics (None without the option), its address checked before anything opens."""
    if args.metrics is None:
        return None
    from ..standby.metrics import StandbyMetrics, parse_address

    if not args.follow:
        raise HostedRoomError("--metrics needs --follow (it serves a running replicator's metrics)")
    parse_address(args.metrics)
    return StandbyMetrics()


@contextmanager
def _serving(metrics: Any, address: str | None, out: TextIO) -> Iterator[None]:
    """Serve ``metrics`` at ``address`` while the block runs (nothing without --metrics)."""
    if metrics is None:
        yield
        return
    host, port = metrics.serve(str(address))
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address
    out.write(terminal_text(f"replicate: metrics at http://{shown}:{port}/metrics") + "\n")
    out.flush()
    try:
        yield
    finally:
        metrics.close()


def _add_target_schema(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--schema", default=os.environ.get(SCHEMA_ENV) or None,
                     help=f"PostgreSQL: this gateway's schema in --to's database (default: ${SCHEMA_ENV}); a "
                     "PostgreSQL source in a schema names it in its URL (?options=-csearch_path%%3DNAME)")


class _NoTokenOption(argparse.Action):
    """``--token VALUE`` (which argparse would otherwise take for ``--token-file``, then quote VALUE in its error):
    refused without repeating the value."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error("there is no --token option (a command line is visible to other users): put the token in a "
                     "file for --token-file, or in $HOSTEDROOMS_PAGE_TOKEN")


def _add_token_file(sub: argparse.ArgumentParser, help_: str) -> None:
    sub.add_argument("--token-file", metavar="PATH", help=help_)
    sub.add_argument("--token", nargs="?", action=_NoTokenOption, help=argparse.SUPPRESS)


def _add_page_client(sub: argparse.ArgumentParser) -> None:
    _add_token_file(sub, "an http(s) source's bearer token: the file's one line (not readable by others; default: "
                    "$HOSTEDROOMS_PAGE_TOKEN)")
    sub.add_argument("--tls-ca", metavar="FILE",
                     help="an https source's certificate is verified against the CA certificates in FILE (PEM) "
                     "instead of the system's")


# --- replicate ---------------------------------------------------------------------------------------------


def _replicate_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--from", dest="source", required=True,
                     help="the authority: its database (path or URL) or its page endpoint (http(s)://...)")
    sub.add_argument("--to", dest="target", default=default_url(),
                     help=f"this gateway's database (default: ${DATABASE_URL_ENV} or ./{DEFAULT_DATABASE})")
    _add_target_schema(sub)
    sub.add_argument("--follow", action="store_true", help="keep replicating until interrupted")
    sub.add_argument("--interval", type=float, default=1.0,
                     help="with --follow: seconds between passes at most (default 1)")
    sub.add_argument("--poll", type=float,
                     help="with --follow: seconds between checks for new commits on the source, which "
                     "start a pass at once (default 0.01 for a database, 0.5 for an http(s) endpoint; "
                     "0: passes at --interval only)")
    sub.add_argument("--max-pages", type=positive_int, default=16,
                     help="with --follow: pages read from one room per pass (default 16)")
    sub.add_argument("--workers", type=positive_int, default=1,
                     help="rooms replicated at once (default 1; more helps where the stores take concurrent "
                     "work, such as PostgreSQL on a machine with cores to spare)")
    sub.add_argument("--gateway", help="this gateway's id, to demote rooms the source shows a newer "
                     "lineage of (default: install:$HOSTEDROOMS_INSTALL_ID)")
    sub.add_argument("--prune-disbanded-after", type=non_negative_int, metavar="SECONDS",
                     help="remove a replica whose room was disbanded this many seconds after its disband, freeing "
                     "its replica slot (default: keep them)")
    sub.add_argument("--source-gateway", metavar="GATEWAY",
                     help="the gateway whose own store --from is: give back the rooms its failover fenced in this "
                     "store and never promoted (needs --from to be that store, not its page endpoint)")
    sub.add_argument("--reclaim-after", type=non_negative_int, metavar="SECONDS", default=300,
                     help="with --source-gateway: leave a fence this many seconds to the failover that wrote it "
                     "(default 300)")
    sub.add_argument("--metrics", metavar="HOST:PORT",
                     help="with --follow: serve Prometheus metrics (every room's lag, the passes' durations and "
                     "failures) at http://HOST:PORT/metrics; port 0 takes a free port (printed); needs the "
                     "metrics extra (prometheus-client)")
    _add_page_client(sub)


def _replicate(args: argparse.Namespace, out: TextIO) -> int:
    from ..standby import PollingWaker, Replicator, open_source

    interval = _seconds(args.interval, "--interval")
    # A database answers a change probe in microseconds; an HTTP endpoint costs a request per look.
    http_source = args.source.startswith(("http://", "https://"))
    poll = _seconds(args.poll if args.poll is not None else 0.5 if http_source else 0.01, "--poll")
    metrics = _standby_metrics(args)
    source = open_source(args.source, **_page_client_options(args, args.source))
    try:
        with engine_of(argparse.Namespace(url=args.target, schema=args.schema)) as target:
            require_schema(target)
            display = _ReplicateDisplay(out, terminal_text(source.describe()))
            replicator = Replicator(source, target, local_gateway_id=args.gateway, on_page=display.on_page,
                                    on_room=display.on_room, workers=args.workers,
                                    max_pages_per_room=args.max_pages if args.follow else None,
                                    prune_disbanded_after=args.prune_disbanded_after,
                                    source_gateway_id=args.source_gateway, reclaim_after=args.reclaim_after)
            if not args.follow:
                report = replicator.sync_once()
                display.progress.done()
                out.write(terminal_text(f"replicate: {report.summary()}") + "\n")
                return EXIT_OK if report.ok else EXIT_FAILED
            last: list[Any] = []

            def on_pass(report: Any) -> None:
                last[:] = [report]
                display.on_pass(report)
                if metrics is not None:
                    metrics.on_pass(report)

            waker = PollingWaker(source.change_token, poll_interval=poll) if poll > 0 else None
            with _stop_on_signals() as stop, _serving(metrics, args.metrics, out):
                replicator.run(interval=interval, waker=waker, stop=stop, on_pass=on_pass)
            display.progress.done()
            tail = f"; last pass: {last[0].summary()}" if last else ""
            out.write(terminal_text(f"replicate: stopped after {display.passes} passes, {display.events:,} events "
                                    f"in {display.pages:,} pages{tail}") + "\n")
            return EXIT_OK
    finally:
        source.close()


REPLICATE = Command("replicate", "keep replicas of every room of another gateway caught up", _replicate,
                      _replicate_arguments, url=False, logging=True)


# --- failover ----------------------------------------------------------------------------------------------


def _failover_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--from-gateway", required=True, help="the silent authority's gateway id (install:...)")
    sub.add_argument("--to", dest="target", default=default_url(),
                     help=f"this gateway's database (default: ${DATABASE_URL_ENV} or ./{DEFAULT_DATABASE})")
    _add_target_schema(sub)
    sub.add_argument("--dry-run", action="store_true", help="report what would be promoted; write nothing")
    sub.add_argument("--gateway", help="this gateway's id (default: install:$HOSTEDROOMS_INSTALL_ID)")
    sub.add_argument("--catch-up-from", metavar="SOURCE",
                     help="replicate from the authority's database or endpoint first (when still readable); its "
                     "database is fenced first (each of its rooms demoted there, so it can no longer write), an "
                     "http(s) endpoint cannot be: stop the authority before")
    sub.add_argument("--reason", default="authority-unreachable", help="recorded in each claim event")
    _add_page_client(sub)


def _failover_line(room: Any) -> str:
    if room.outcome == "promoted":
        what = f"epoch {room.previous_epoch} -> {room.epoch}, claim at seq {room.claim_seq}"
    elif room.outcome == "would-promote":
        what = f"epoch {room.previous_epoch} -> {room.epoch} (seq {room.last_seq})"
    elif room.outcome == "taken-over":
        what = f"epoch {room.previous_epoch} -> {room.epoch}, {room.reason}"
    else:
        what = f"{room.outcome}: {room.reason}"
    label = {"promoted": "promoted", "would-promote": "would promote", "taken-over": "taken over",
             "released": "left", "fenced": "pending"}.get(room.outcome, "not promoted")
    return terminal_text(f"{label:<13} {room.room_id}  {what}")


def _failover(args: argparse.Namespace, out: TextIO) -> int:
    from ..identity import local_gateway_id
    from ..standby import failover, open_source

    if args.dry_run and args.catch_up_from:
        raise HostedRoomError("--dry-run writes nothing: run `hostedrooms replicate` first instead of "
                              "--catch-up-from")
    local = local_gateway_id(args.gateway)
    # Every message names the source as describe_target masks it: the URL may carry a password.
    named = describe_target(args.catch_up_from) if args.catch_up_from else ""
    try:
        with engine_of(argparse.Namespace(url=args.target, schema=args.schema)) as target:
            require_schema(target)
            options = _page_client_options(args, args.catch_up_from)
            source = open_source(args.catch_up_from, **options) if args.catch_up_from else None
            try:
                report = failover(target, from_gateway=args.from_gateway, local_gateway_id=local,
                                  dry_run=args.dry_run, reason=args.reason, catch_up_from=source)
            finally:
                if source is not None:
                    source.close()
    except (HostedRoomError, OSError, sa.exc.SQLAlchemyError) as exc:
        if args.catch_up_from and args.catch_up_from in str(exc):
            raise HostedRoomError(str(exc).replace(args.catch_up_from, named)) from None
        raise
    if report.catch_up is not None:
        if report.fenced:
            out.write(terminal_text(f"fenced: {len(report.fenced)} rooms of {report.from_gateway} in {named}")
                      + "\n")
        out.write(terminal_text(f"catch-up: {report.catch_up.summary()}") + "\n")
        if report.catch_up.error:
            fenced = (f"; the {len(report.fenced)} rooms fenced in its store stay fenced: run failover again"
                      if report.fenced else "")
            raise HostedRoomError(f"the catch-up from {named} failed ({redact(report.catch_up.error)}); nothing was "
                                  f"promoted{fenced} (without --catch-up-from, failover promotes what is "
                                  "replicated)")
    for room in report.rooms:
        out.write(_failover_line(room) + "\n")
    out.write(terminal_text(f"failover: {report.summary()}") + "\n")
    return EXIT_OK if report.ok else EXIT_FAILED


FAILOVER = Command("failover", "promote every caught-up replica of a silent authority", _failover, _failover_arguments,
                   url=False, logging=True)


# --- serve-pages -------------------------------------------------------------------------------------------


def _serve_pages_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                     help="the address to serve at (default 127.0.0.1:0: loopback, a free port, printed)")
    sub.add_argument("--prefix", default="", help="the endpoint's path (e.g. /standby; default: the root)")
    _add_token_file(sub, "the bearer token standbys must send: the file's one line (not readable by others; "
                    "default: $HOSTEDROOMS_PAGE_TOKEN); required unless HOST is loopback")
    sub.add_argument("--insecure-no-token", action="store_true",
                     help="serve beyond loopback without a token (every client that can connect reads every room)")
    sub.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    sub.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")


def _serve_pages(args: argparse.Namespace, out: TextIO) -> int:
    """Serve this gateway's pages to its standbys until SIGINT or SIGTERM."""
    from ..standby import EnginePageSource, PageServer
    from ..standby.auth import in_clear, is_loopback, resolve_token, server_tls_context
    from ..standby.metrics import parse_address

    address = parse_address(args.listen, option="--listen")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise HostedRoomError("--tls-cert and --tls-key go together")
    token = resolve_token(args.token_file)
    if token is not None and args.insecure_no_token:
        raise HostedRoomError("--insecure-no-token with a token (--token-file or $HOSTEDROOMS_PAGE_TOKEN): "
                              "choose one")
    context = None if args.tls_cert is None else server_tls_context(args.tls_cert, args.tls_key)
    with engine_of(args) as engine:
        require_schema(engine)
        source = EnginePageSource(engine)
        try:
            with PageServer(source, address, prefix=args.prefix, token=token, ssl_context=context,
                            insecure_no_token=args.insecure_no_token) as server, _stop_on_signals() as stop:
                if token is None and not is_loopback(str(server.server_address[0])):
                    _warn(f"serving every room of {describe_target(engine.url)} WITHOUT A TOKEN at {server.url} "
                          "(--insecure-no-token): anyone who can connect reads every room and can serve a log "
                          "that demotes a returning authority")
                elif in_clear(server.url):
                    _warn(f"the token and the pages cross the network in clear at {server.url}: serve with "
                          "--tls-cert and --tls-key (or behind a TLS proxy)")
                guard = "token required" if token is not None else "no token"
                out.write(terminal_text(f"serve-pages: {describe_target(engine.url)} at {server.url} ({guard})")
                          + "\n")
                out.flush()
                stop.wait()
        finally:
            source.close()
    out.write("serve-pages: stopped\n")
    return EXIT_OK


SERVE_PAGES = Command("serve-pages", "serve this gateway's pages to its standbys (until interrupted)", _serve_pages,
                      _serve_pages_arguments, logging=True)

#: This module's commands.
COMMANDS = (REPLICATE, FAILOVER, SERVE_PAGES)
