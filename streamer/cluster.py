"""`streamer call --dask`: the batch plan made here, each batch read and computed on a Dask worker.

The client plans batches from the BAM (no signal is read here) and submits each as a task that
names its reads, their signal files and alignments. A worker reads the signal from the shared
filesystem, runs the stages on its own pipeline (on its GPU where it has one), renders the rows
and sends back text and counts only: no signal travels through the scheduler. Results are
written in batch order, so the output is byte-identical to a local run.

A task whose worker dies is run again on another (Dask reschedules it); a task that raises is
tried once more, and if it fails again its reads are reported skipped (`Skip.WORKER_FAILED`)
like any bad read. Dask is an install extra (`streamer[cluster]`); this module imports it only
when a cluster is asked for.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamer.pipeline.batching import Pending, batch_inputs, load_signals, signal_requests
from streamer.errors import InputError, StreamerError
from streamer.pipeline.stages import Pipeline, PipelineOptions
from streamer.skips import Skip, Skipped

log = logging.getLogger(__name__)

# Fault injection for tests: the first task to find this file absent creates it and kills its worker.
KILL_ONCE_ENV = "STREAMER_FAULT_KILL_WORKER_ONCE"
IN_FLIGHT_PER_WORKER = 2  # batches queued on each worker, so none waits for the client between batches


@dataclass(frozen=True)
class ClusterJob:
    """What every task of a run shares; each worker opens it once (models, kernels, reference)."""

    options: PipelineOptions
    genome: str
    analysis: str = "cpg"
    sink: str = "calls"


@dataclass
class BatchOutcome:
    """A batch as a worker hands it back: rendered rows and counts, never signal."""

    text: str
    calls: int
    n_in: int
    n_called: int
    n_bases: int
    skipped: list[Skipped]
    timings: dict[str, float] = field(default_factory=dict)
    worker: str = ""


_OPEN: dict[ClusterJob, tuple[Any, Any, Any]] = {}  # per worker process


def _opened(job: ClusterJob) -> tuple[Any, Any, Any]:
    if job not in _OPEN:
        from streamer import registry
        from streamer.io.reference import Reference
        from streamer.sinks import open_sink

        pipeline = Pipeline(job.options, [registry.analysis(job.analysis)])
        _OPEN[job] = (pipeline, Reference(job.genome).__enter__(), open_sink(job.sink))
    return _OPEN[job]


def run_batch(job: ClusterJob, pending: list[Pending], planned: list[Skipped]) -> BatchOutcome:
    """One planned batch on a worker: its signal read, the stages, the rows rendered."""
    pipeline, ref, sink = _opened(job)
    t0 = time.perf_counter()
    signals, errors = load_signals(signal_requests(pending))
    timings = {"read": time.perf_counter() - t0}
    marker = os.environ.get(KILL_ONCE_ENV)
    if marker and pending:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            os._exit(1)  # mid-batch, as a crash would
        except FileExistsError:
            pass
    reads, failed = batch_inputs(pending, signals, errors, ref)
    n_in = len(planned) + len(pending)
    if not reads:
        return BatchOutcome("", 0, n_in, 0, 0, planned + failed, timings, _worker_name())
    result = pipeline.process(reads)
    t1 = time.perf_counter()
    text = sink.render(result)
    timings.update(result.timings, format=time.perf_counter() - t1)
    return BatchOutcome(text, sink.count(result), n_in, result.n_reads - len(result.skipped), result.n_bases,
                        planned + failed + result.skipped, timings, _worker_name())  # fmt: skip


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return ""


def _missing(paths: list[str]) -> list[str]:
    return [p for p in paths if not os.path.exists(p)]


def connect(address: str, threads: int) -> tuple[Any, int, Callable[[], None]]:
    """A Dask client for `address` (`tcp://host:8786`, or `local` / `local:N` for N worker processes
    here), how many workers it has, and what closes them (a local cluster with its client)."""
    # Dask's own INFO lines (nannies, scheduler, workers here) only with -vv, like every library's
    quiet = logging.getLogger().getEffectiveLevel() > logging.DEBUG
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning" if quiet else "info")
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise StreamerError("--dask needs Dask: pip install 'streamer[cluster]'") from None
    if address == "local" or address.startswith("local:"):
        n = int(address.partition(":")[2] or max(1, (os.cpu_count() or 1) // max(1, threads)))
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)

        def close() -> None:
            client.close()
            cluster.close()

        return client, n, close
    try:
        client = Client(address, timeout="30s")
    except (OSError, TimeoutError) as exc:
        raise StreamerError(f"--dask {address}: cannot reach the scheduler ({exc})") from None
    return client, max(1, len(client.scheduler_info()["workers"])), client.close


def check_paths(client: Any, paths: Iterable[Path]) -> None:
    """Every worker must see the inputs on its filesystem: one line naming a worker and a file it cannot see."""
    wanted = [str(Path(p).resolve()) for p in paths]
    for worker, missing in sorted(client.run(_missing, wanted).items()):
        if missing:
            raise InputError(missing[0], f"not visible on Dask worker {worker} (workers read inputs from a "
                             f"shared filesystem; {len(missing)} of {len(wanted)} paths missing there)")  # fmt: skip


def run_on_cluster(client: Any, workers: int, job: ClusterJob,
                   plans: Iterable[tuple[int, list[Pending], list[Skipped]]],
                   on_outcome: Callable[[int, BatchOutcome], None]) -> None:  # fmt: skip
    """Every planned (batch number, pending, skipped) through a worker; outcomes in batch order."""
    from distributed import KilledWorker

    window: deque = deque()
    limit = max(1, workers * IN_FLIGHT_PER_WORKER)

    def take() -> None:
        seq, pending, planned, future = window.popleft()
        try:
            outcome = future.result()
        except KilledWorker as exc:
            outcome = _failed(pending, planned, f"its workers died ({exc})")
        except Exception as exc:  # the task's own error, after its retry
            outcome = _failed(pending, planned, f"{type(exc).__name__}: {exc}")
        on_outcome(seq, outcome)

    for seq, pending, planned in plans:
        window.append((seq, pending, planned, client.submit(run_batch, job, pending, planned, retries=1, pure=False)))
        if len(window) >= limit:
            take()
    while window:
        take()


def _failed(pending: list[Pending], planned: list[Skipped], why: str) -> BatchOutcome:
    log.warning("a batch of %d reads failed twice on the cluster: %s", len(pending), why)
    skipped = [Skipped(p.aln.read_id, Skip.WORKER_FAILED, f"batch failed twice on the cluster: {why}")
               for p in pending]  # fmt: skip
    return BatchOutcome("", 0, len(planned) + len(pending), 0, 0, planned + skipped)
