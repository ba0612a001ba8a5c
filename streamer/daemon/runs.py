"""One daemon, several runs: a `Daemon` per run folder, all on one warm pipeline and its GPUs.

A GPU server beside a GridION or PromethION sees one run folder per flow cell. Each run keeps
what makes a lone daemon exactly-once: its own output folder (`OUTDIR/<run folder name>`), ledger
and engine thread. The pipeline is shared, its batches handed out fairly between the runs
(`streamer.daemon.fair`), so that a flow cell that starts late or trickles is not held behind
another's backlog; so are the reference, which every run's assembler thread reads at once
(`streamer.io.reference` makes that safe), and the minimap2 index (`made_once`). Runs are the
folders given (`watch.dir` and `watch.also`) or, with `watch.each_run`, the folders of `watch.dir`,
including those that appear while it runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from streamer.config import Config
from streamer.daemon.shell import Daemon, PipelineLike
from streamer.errors import ConfigError, StreamerError
from streamer.daemon.fair import SharedPipeline
from streamer.metrics import combined
from streamer.daemon.notify import Notifier

log = logging.getLogger(__name__)
T = TypeVar("T")


def run_folders(cfg: Config) -> list[Path]:
    """The run folders watched now: those given, or the folders in `watch.dir` (not the outputs, not hidden)."""
    if not cfg.watch.each_run:
        return [cfg.watch.dir, *(Path(p).expanduser() for p in cfg.watch.also)]
    skip = {p.resolve() for p in (cfg.output.dir, cfg.output.state_dir) if p is not None}
    return sorted(p for p in cfg.watch.dir.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.resolve() not in skip)  # fmt: skip


def made_once(make: Callable[[], T]) -> Callable[[], T]:
    """`make`, called by the first run that needs it; the others get the same object (one minimap2
    index for all the runs: a human one takes gigabytes)."""
    lock = threading.Lock()
    made: list[T] = []

    def get() -> T:
        with lock:
            if not made:
                made.append(make())
            return made[0]

    return get


def several_runs(cfg: Config) -> bool:
    return cfg.watch.each_run or bool(cfg.watch.also)


RUN_NAME = "{run}"  # in a publish endpoint: the run folder's name


def check_publishing(cfg: Config) -> None:
    """With several runs each run publishes its own stream (its run id, sequences and snapshots), so
    every endpoint must differ between runs: `{run}` in it, or a port the system picks (`:*`, the
    bound address is logged and in the run's summary.json)."""
    p = cfg.publish
    given = [("publish.endpoint", p.endpoint), *(("publish.extra_endpoints", e) for e in p.extra_endpoints),
             ("publish.snapshot_endpoint", p.snapshot_endpoint)]
    for key, endpoint in given:
        if endpoint and RUN_NAME not in endpoint and not endpoint.endswith(":*"):
            raise ConfigError(f"{key} {endpoint}: with several runs each run publishes its own stream: put "
                              f"{RUN_NAME} in it (ipc:///run/streamer/{RUN_NAME}.sock) or let the port be chosen "
                              "(tcp://127.0.0.1:*)")


def _for_run(endpoint: str | None, name: str) -> str | None:
    return endpoint.replace(RUN_NAME, name) if endpoint else endpoint


def run_config(cfg: Config, run_dir: Path) -> Config:
    """The configuration of one of several runs: its folder watched, its outputs and state under its name."""
    out = cfg.output.dir / run_dir.name
    out.mkdir(parents=True, exist_ok=True)
    state = cfg.output.state_dir / run_dir.name if cfg.output.state_dir is not None else None
    p = cfg.publish
    publish = replace(p, endpoint=_for_run(p.endpoint, run_dir.name), snapshot_endpoint=_for_run(
        p.snapshot_endpoint, run_dir.name), extra_endpoints=tuple(_for_run(e, run_dir.name) for e in p.extra_endpoints))
    return replace(cfg, watch=replace(cfg.watch, dir=run_dir, also=(), each_run=False),
                   output=replace(cfg.output, dir=out, state_dir=state), publish=publish)  # fmt: skip


class RunSet:
    """`run()` (blocks; the exit status), then `close()`; `request_stop()` from a signal handler."""

    def __init__(self, config: Config, pipeline: PipelineLike, make_daemon: Callable[[Config, PipelineLike], Daemon],
                 notifier: Notifier, slots: int = 1):  # fmt: skip
        self.config = config
        self.shared = SharedPipeline(pipeline, slots)
        self.make_daemon = make_daemon
        self.notifier = notifier
        self.daemons: dict[Path, Daemon] = {}
        self._refused: set[Path] = set()  # a second folder of a name already watched, or one that failed to start
        self.codes: dict[Path, int] = {}
        self._threads: dict[Path, threading.Thread] = {}
        self._stop = threading.Event()
        self._stop_why = "SIGTERM"  # the signal that asked for the stop, for the log

    @property
    def status(self) -> dict[str, Any]:
        """The runs' statuses as one (`streamer.metrics.combined`); any thread."""
        return combined([d.status for d in list(self.daemons.values()) if d.status])

    @property
    def abandoned(self) -> bool:
        return any(d.abandoned for d in self.daemons.values())

    def request_stop(self, why: str = "SIGTERM") -> None:
        self._stop_why = why
        self._stop.set()
        for daemon in list(self.daemons.values()):
            daemon.request_stop(why)

    def _add(self, run_dir: Path) -> None:
        name = run_dir.name
        if any(p.name == name for p in self.daemons):
            log.error("%s: another run folder is already called %s; its output folder would be shared: not watched",
                      run_dir, name)  # fmt: skip
            self._refused.add(run_dir)
            return
        try:
            daemon = self.make_daemon(run_config(self.config, run_dir), self.shared.for_run(name))
            daemon.start()
        except (StreamerError, OSError) as exc:  # this run's folder or state; the others go on
            log.error("run %s not watched: %s", name, exc)
            self._refused.add(run_dir)
            self.codes[run_dir] = 1
            return
        self.daemons[run_dir] = daemon
        if self._stop.is_set():
            daemon.request_stop(self._stop_why)

        def main() -> None:
            self.codes[run_dir] = daemon.run()

        thread = threading.Thread(target=main, name=f"run-{name}", daemon=True)
        self._threads[run_dir] = thread
        thread.start()
        log.info("run %s: watching %s, outputs in %s", name, run_dir, daemon.config.output.dir)

    def _discover(self) -> None:
        for run_dir in run_folders(self.config):
            if run_dir not in self.daemons and run_dir not in self._refused:
                self._add(run_dir)

    def _over(self) -> bool:
        if any(t.is_alive() for t in self._threads.values()):
            return False
        # given runs end with their runs; a parent folder is watched until SIGTERM or its STOP file
        return self._stop.is_set() or not self.config.watch.each_run or \
            (self.config.watch.dir / self.config.end.stop_file).exists()

    def run(self) -> int:
        cfg = self.config
        self._discover()
        self.notifier.ready(self._status_line())
        tick = min(x for x in (self.notifier.watchdog_interval, cfg.service.status_interval, 0.5) if x)
        next_scan = next_status = next_ping = time.monotonic()
        while not self._over():
            time.sleep(tick)
            now = time.monotonic()
            if cfg.watch.each_run and now >= next_scan and not self._stop.is_set():
                self._discover()
                next_scan = now + cfg.watch.poll_interval
            stalled = [d for d in self.daemons.values() if d.stalled(cfg.service.stall_timeout)]
            if self.notifier.watchdog_interval and now >= next_ping and not stalled:
                self.notifier.watchdog()
                next_ping = now + self.notifier.watchdog_interval
            if now >= next_status:
                self.notifier.status(self._status_line())
                next_status = now + cfg.service.status_interval
            if self.abandoned:
                return 0
        self.notifier.stopping(self._status_line())
        return max(self.codes.values(), default=0)

    def close(self) -> None:
        for daemon in self.daemons.values():
            daemon.close()
        self.notifier.close()

    def _status_line(self) -> str:
        runs = [f"{p.name}: {d.status_line()}" for p, d in self.daemons.items()]
        return f"{len(runs)} runs; " + "; ".join(runs) if runs else "waiting for a run folder"
