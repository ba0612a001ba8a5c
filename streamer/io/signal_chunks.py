"""A reader task: the signal of some reads, loaded where the task runs and handed back as columns.

Apart from the batches' planning and packing (`streamer.pipeline.batching`), so that a reader process
imports the formats' readers and numpy and nothing else: numba's import alone is half a second on a
GPU box, and the readers' fork server imports what its readers run before the first batch can be read.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamer.errors import InputError
from streamer.io.signal import read_signal, read_signals
from streamer.io.signal_record import SignalRecord


def load_signals(wanted: Mapping[Path, list[str]]) -> tuple[dict[str, SignalRecord], dict[str, str]]:
    """Signals of the wanted reads, opening each file once; reads that fail get the error text."""
    got: dict[str, SignalRecord] = {}
    errors: dict[str, str] = {}
    for path, ids in wanted.items():
        try:
            for rec in read_signals(path, ids):
                got[rec.read_id] = rec
        except InputError:
            # find out which reads the damage touches, one at a time
            for rid in ids:
                if rid not in got:
                    try:
                        got[rid] = read_signal(path, rid)
                    except InputError as exc:
                        errors[rid] = str(exc)
        for rid in ids:
            if rid not in got and rid not in errors:
                errors[rid] = f"{path}: read not found in this signal file"
    return got, errors


_NO_SAMPLES = np.zeros(0, np.int16)


@dataclass
class SignalChunk:
    """One reader task's reads as columns: their samples end to end in `raw`, where each read's lie,
    their calibration, and the reads that failed, with why."""

    read_ids: list[str]
    start: np.ndarray  # int64: each read's first sample in raw
    length: np.ndarray  # int64
    calibration: np.ndarray  # float64[n, 4]: digitisation, offset, range, sample rate
    raw: np.ndarray  # int16
    errors: dict[str, str]
    seconds: float  # busy time of the task
    started: float = 0.0  # perf_counter at its start (the system's monotonic clock: comparable across processes)
    worker: str = ""  # the process and thread that ran it


def load_chunk(wanted: Mapping[Path, list[str]]) -> SignalChunk:
    """`load_signals` as a reader task (a worker process or thread), handed back as columns."""
    t0 = time.perf_counter()
    signals, errors = load_signals(wanted)
    recs = list(signals.values())
    length = np.fromiter((len(r.raw) for r in recs), np.int64, len(recs))
    raw = np.concatenate([r.raw for r in recs]).astype(np.int16, copy=False) if recs else _NO_SAMPLES
    cal = np.array([(r.digitisation, r.offset, r.range, r.sample_rate) for r in recs], np.float64).reshape(-1, 4)
    return SignalChunk(list(signals), np.cumsum(length) - length, length, cal, raw, errors,
                       time.perf_counter() - t0, t0, f"{os.getpid()} {threading.current_thread().name}")


def chunk_records(chunks: Iterable[SignalChunk], read_ids: Container[str] | None = None
                  ) -> tuple[dict[str, SignalRecord], dict[str, str]]:  # fmt: skip
    """The reader tasks' records (their samples views of the task's array) and failures, of `read_ids` or all."""
    records: dict[str, SignalRecord] = {}
    errors: dict[str, str] = {}
    for c in chunks:
        for j, rid in enumerate(c.read_ids):
            if read_ids is None or rid in read_ids:
                s, n = int(c.start[j]), int(c.length[j])
                records[rid] = SignalRecord(rid, c.raw[s : s + n], *c.calibration[j].tolist())
        errors.update((rid, why) for rid, why in c.errors.items() if read_ids is None or rid in read_ids)
    return records, errors
