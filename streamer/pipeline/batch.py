"""The batch record: reads packed into flat arrays, filled in stage by stage.

`ReadInput` is what a source hands over for one alignment record (Python objects,
built once per read at the edge); `pack`, the one packer of every command, turns a list
of them into a `ReadBatch` whose arrays the numba stages work on, converting the raw
samples to pA straight into the batch's flat array. The stages then fill the batch in:
events, scalings, the ABEA pairs, the recalibration (`post`), and what each analysis
made of it (`products`). Field meanings: docs/design.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
from numba.typed import List

from streamer.io.fast5 import SignalRecord
from streamer.skips import Skip

if TYPE_CHECKING:
    from streamer.pipeline.postalign import PostAlign

# CIGAR operation codes as pysam/htslib number them.
CIGAR_M, CIGAR_I, CIGAR_D, CIGAR_N, CIGAR_S, CIGAR_H, CIGAR_P, CIGAR_EQ, CIGAR_X = range(9)


@dataclass
class ReadInput:
    """One alignment record with its basecalls, signal and reference span."""

    read_id: str
    seq: str  # basecalled read as sequenced
    signal: SignalRecord  # raw samples and the calibration that turns them into pA
    ref_name: str
    ref_start: int  # 0-based, inclusive
    ref_end: int  # 0-based, exclusive
    rc: bool  # aligned to the reverse strand
    cigar: np.ndarray  # int32[n_ops, 2]: (op, length) as pysam's cigartuples
    ref_seq: str  # reference[ref_start:ref_end], upper case
    signal_path: str = ""  # where the signal came from (reports, eventalign summary)
    number: int = -1  # the record's number where it came from (BAM record index, ledger read number)
    mapq: int = 0
    ref_next: str = ""  # reference[ref_end], fetched by nanopolish and f5c too; "" at the end


def _concat(parts, dtype):
    off = np.zeros(len(parts) + 1, dtype=np.int64)
    if parts:
        np.cumsum([len(p) for p in parts], out=off[1:])
        flat = np.concatenate(parts).astype(dtype, copy=False) if off[-1] else np.zeros(0, dtype)
    else:
        flat = np.zeros(0, dtype)
    return flat, off


def _ascii(s: str) -> np.ndarray:
    return np.frombuffer(s.encode("ascii"), dtype=np.uint8)


@dataclass
class ReadBatch:
    """Flat arrays for n alignment records; later stages fill the empty fields."""

    read_ids: list[str]
    ref_names: list[str]
    signal_paths: list[str]
    seq: np.ndarray
    seq_off: np.ndarray
    signal: np.ndarray
    signal_off: np.ndarray
    sample_rate: np.ndarray
    ref_start: np.ndarray
    ref_end: np.ndarray
    rc: np.ndarray
    cigar: np.ndarray  # int32[total_ops, 2]
    cigar_off: np.ndarray
    ref_seq: np.ndarray
    ref_seq_off: np.ndarray
    status: np.ndarray
    numbers: np.ndarray  # int64: each record's `ReadInput.number`
    mapq: np.ndarray  # int64
    ref_next: np.ndarray  # uint8: `ReadInput.ref_next` in ASCII, 0 where there is none
    # filled by the stages
    ev_start: np.ndarray | None = None
    ev_length: np.ndarray | None = None
    ev_mean: np.ndarray | None = None
    ev_stdv: np.ndarray | None = None
    ev_off: np.ndarray | None = None
    shift: np.ndarray | None = None
    scale: np.ndarray | None = None
    var: np.ndarray | None = None
    aln_kmer: np.ndarray | None = None
    aln_event: np.ndarray | None = None
    aln_off: np.ndarray | None = None
    post: PostAlign | None = None  # recalibration; its shift/scale/var are also copied to the fields above
    mom_scalings: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # method of moments, before recalibration
    stats: dict[str, Any] = field(default_factory=dict)  # a GPU stage's measurements, by stage name
    products: dict[str, Any] = field(default_factory=dict)  # what each analysis made of the batch, by its name

    @property
    def n(self) -> int:
        return len(self.read_ids)

    @property
    def n_bases(self) -> int:
        return int(self.seq_off[-1])

    def fail(self, i: int, reason: Skip) -> None:
        if self.status[i] == Skip.OK:
            self.status[i] = reason


@numba.njit(nogil=True, cache=True, parallel=True)
def _gather_pa(raws, off, unit, offset):
    """pA of every read, end to end: (float32(raw) + offset) * unit, as `SignalRecord.to_pa` rounds it."""
    n = off.shape[0] - 1
    out = np.empty(off[n], np.float32)
    for i in numba.prange(n):
        src = raws[np.int64(i)]  # a typed list takes a signed index
        o = off[i]
        for t in range(off[i + 1] - o):
            out[o + t] = (np.float32(src[t]) + offset[i]) * unit[i]
    return out


def _pack_signal(signals: list[SignalRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Every read's samples in pA in one flat array (the raw arrays may be views of a reader's chunk)."""
    off = np.zeros(len(signals) + 1, np.int64)
    np.cumsum([len(s.raw) for s in signals], out=off[1:])
    if not off[-1]:
        return np.zeros(0, np.float32), off
    unit = np.array([np.float32(s.range) / np.float32(s.digitisation) for s in signals], np.float32)
    offset = np.array([s.offset for s in signals], np.float32)
    raws = List([np.asarray(s.raw, np.int16) for s in signals])
    return _gather_pa(raws, off, unit, offset), off


def pack(reads: list[ReadInput]) -> ReadBatch:
    """Pack reads into one batch of flat arrays."""
    seq, seq_off = _concat([_ascii(r.seq) for r in reads], np.uint8)
    signal, signal_off = _pack_signal([r.signal for r in reads])
    cigar_parts = [np.asarray(r.cigar, dtype=np.int32).reshape(-1, 2) for r in reads]
    cigar_off = np.zeros(len(reads) + 1, dtype=np.int64)
    np.cumsum([len(c) for c in cigar_parts], out=cigar_off[1:])
    cigar = np.concatenate(cigar_parts) if cigar_parts else np.zeros((0, 2), np.int32)
    ref_seq, ref_seq_off = _concat([_ascii(r.ref_seq) for r in reads], np.uint8)
    return ReadBatch(
        read_ids=[r.read_id for r in reads],
        ref_names=[r.ref_name for r in reads],
        signal_paths=[r.signal_path for r in reads],
        seq=seq,
        seq_off=seq_off,
        signal=signal,
        signal_off=signal_off,
        sample_rate=np.array([r.signal.sample_rate for r in reads], dtype=np.float64),
        ref_start=np.array([r.ref_start for r in reads], dtype=np.int64),
        ref_end=np.array([r.ref_end for r in reads], dtype=np.int64),
        rc=np.array([r.rc for r in reads], dtype=np.bool_),
        cigar=cigar.astype(np.int32, copy=False),
        cigar_off=cigar_off,
        ref_seq=ref_seq,
        ref_seq_off=ref_seq_off,
        status=np.zeros(len(reads), dtype=np.int8),
        numbers=np.array([r.number for r in reads], dtype=np.int64),
        mapq=np.array([r.mapq for r in reads], dtype=np.int64),
        ref_next=np.array([ord(r.ref_next) if r.ref_next else 0 for r in reads], dtype=np.uint8),
    )
