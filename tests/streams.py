"""Helpers for the ZeroMQ tests: loopback configs on ephemeral ports, batches, a leak check."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from streamer.publish import Categorical, PublisherConfig

HEARTBEAT = 0.2  # lost after 0.6 s of silence: ample even on a loaded machine


def local_config(**overrides) -> PublisherConfig:
    """Loopback on ephemeral ports, fast heartbeats, no lingering on close."""
    settings = dict(endpoints=("tcp://127.0.0.1:*",), snapshot_endpoint="tcp://127.0.0.1:*",
                    heartbeat_interval=HEARTBEAT, linger=0)
    settings.update(overrides)
    return PublisherConfig(**settings)


def call_batch(n: int, first: int = 0) -> dict:
    """n calls on two reads; `first` offsets positions so batches differ."""
    start = np.arange(first, first + n, dtype=np.int64) * 10
    reads = (np.arange(n) >= n // 2).astype(np.int64)
    llr = np.linspace(-8.0, 8.0, n) + first
    return {
        "chromosome": Categorical(["chr1", "chr2"], reads),
        "strand": ["+" if i % 3 else "-" for i in range(n)],
        "start": start,
        "end": start + 2,
        "read_name": Categorical([f"read{first}a", f"read{first}b"], reads),
        "log_lik_ratio": llr,
        "log_lik_methylated": llr - 50.0,
        "log_lik_unmethylated": np.full(n, -50.0),
        "num_calling_strands": np.ones(n, dtype=np.int32),
        "num_motifs": np.arange(n, dtype=np.int32) % 3 + 1,
        "sequence": [f"ACG{'T' * (i % 4)}CGA" for i in range(n)],
    }


def freq_batch(starts, called: int, methylated: int) -> dict:
    starts = np.asarray(starts, dtype=np.int64)
    n = len(starts)
    zeros = np.zeros(n, dtype=np.int64)
    return {
        "source": ["hmm"] * n,
        "chromosome": ["chr1"] * n,
        "start": starts,
        "end": starts + 1,
        "strand": ["."] * n,
        "mod_code": ["m"] * n,
        "num_motifs_in_group": np.ones(n, dtype=np.int32),
        "called_sites": np.full(n, called),
        "called_sites_methylated": np.full(n, methylated),
        "group_sequence": ["ACGT"] * n,
        "count_canonical": np.full(n, called - methylated),
        "count_other_mod": zeros, "count_delete": zeros, "count_fail": zeros, "count_diff": zeros,
        "count_nocall": zeros,
    }


def _open_fds() -> set[str]:
    """Open descriptors, as fd -> target; the GPU driver's device files (kept for the process's life) left out."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (listdir's own descriptor)
            continue
        if not target.startswith("/dev/nvidia"):
            fds.add(f"{fd} -> {target}")
    return fds


@pytest.fixture(autouse=True)
def no_leaks():
    """Every socket, context and thread a test opens is closed by its end.

    Objects a test drops are collected before this runs, so test modules also
    turn ResourceWarning (pyzmq's "unclosed socket/context") into an error.
    """
    threads, fds = set(threading.enumerate()), _open_fds()
    yield
    deadline = time.monotonic() + 5.0  # waited out only when something is left: a leak stays, a busy machine lags
    while (set(threading.enumerate()) - threads or _open_fds() - fds) and time.monotonic() < deadline:
        time.sleep(0.01)  # a joined thread can take a moment to leave threading.enumerate()
    assert set(threading.enumerate()) <= threads, "threads left running"
    left = _open_fds() - fds
    assert not left, f"file descriptors left open (sockets or contexts not closed): {sorted(left)}"


def next_of(sub, kind):
    """The next message of type `kind`, passing over others (heartbeats)."""
    for msg in sub:
        if isinstance(msg, kind):
            return msg
    raise AssertionError(f"the stream ended before a {kind.__name__}")


def tsv_rows(batch) -> list[str]:
    """A received `CallBatch` as call-methylation TSV rows, printed the way f5c prints them."""
    return [f"{c}\t{s}\t{b}\t{e}\t{r}\t{lr:.2f}\t{lm:.2f}\t{lu:.2f}\t{k}\t{m}\t{q}\n"
            for c, s, b, e, r, lr, lm, lu, k, m, q in batch.rows()]
