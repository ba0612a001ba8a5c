"""The batch record: reads packed into flat arrays, filled in stage by stage.

`pack_records`, the one packer of every command, turns alignment records, their basecalls, their
raw samples where the readers left them (`Samples`) and their reference bases (`RefBases`) into a
`ReadBatch` whose arrays the numba stages work on, converting the samples to pA straight into the
batch's flat array. `streamer call`'s batches go to it from the reader tasks' arrays
(`streamer.pipeline.batching.assemble_batch`); `pack` takes `ReadInput`s, one alignment record's
Python objects, which the daemon keeps for its read-by-read retry (`synthetic_read` makes the one a
pipeline's warm-up runs). The stages then fill the batch in:
events, scalings, the ABEA pairs, the recalibration (`post`), and what each analysis
made of it (`products`). Field meanings: docs/design.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numba
import numpy as np
from numba import types
from numba.core.extending import intrinsic

from streamer.io.signal_record import SignalRecord
from streamer.pipeline.chunks import chunked
from streamer.pore.model import PoreModel
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
    event_spread: bool = True  # its events' starts, lengths and spreads are made: a sink renders them
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
    ran: dict[str, float] = field(default_factory=dict)  # stages run ahead (`Pipeline.front`): their seconds
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


class Aligned(Protocol):
    """The fields of an alignment record that packing reads (`AlignmentRecord` and `ReadInput` have them)."""

    read_id: str
    ref_name: str
    ref_start: int
    ref_end: int
    rc: bool
    mapq: int
    cigar: np.ndarray


@dataclass(frozen=True)
class Samples:
    """Raw samples of a batch's records, wherever they lie: record i's are `length[i]` samples of
    `sources[source[i]]` from `start[i]`, turned into pA with its `unit` and `offset` (float32, as f5c)."""

    sources: list[np.ndarray]  # int16: a reader task's samples end to end, or one read's
    source: np.ndarray  # int64
    start: np.ndarray  # int64
    length: np.ndarray  # int64
    unit: np.ndarray  # float32: range / digitisation, divided in float32
    offset: np.ndarray  # float32
    sample_rate: np.ndarray  # float64

    @classmethod
    def of(cls, signals: Sequence[SignalRecord]) -> Samples:
        """Records' samples where they are: each record's raw array a source."""
        n = len(signals)
        length = np.fromiter((len(s.raw) for s in signals), np.int64, n)
        cal = np.array([(s.digitisation, s.offset, s.range, s.sample_rate) for s in signals], np.float64).reshape(-1, 4)
        return cls.calibrated([s.raw for s in signals], np.arange(n, dtype=np.int64), np.zeros(n, np.int64), length,
                              cal)

    @classmethod
    def calibrated(cls, sources: list[np.ndarray], source: np.ndarray, start: np.ndarray, length: np.ndarray,
                   cal: np.ndarray) -> Samples:  # fmt: skip
        """From each record's calibration as columns: digitisation, offset, range, sample rate (float64)."""
        unit = cal[:, 2].astype(np.float32) / cal[:, 0].astype(np.float32)
        return cls(sources, source, start, length, unit, cal[:, 1].astype(np.float32), cal[:, 3].copy())


@dataclass(frozen=True)
class RefBases:
    """The reference under a batch's records: record i's bases are `length[i]` bytes of `text` from
    `at[i]` (upper-case ASCII), the base after them `next[i]` (0 where the contig ends)."""

    text: np.ndarray  # uint8
    at: np.ndarray  # int64
    length: np.ndarray  # int64
    next: np.ndarray  # uint8

    @classmethod
    def of(cls, spans: Sequence[str], after: Sequence[str]) -> RefBases:
        text, off = encode_all(spans)
        return cls(text, off[:-1], np.diff(off), np.array([ord(c) if c else 0 for c in after], np.uint8))


@intrinsic
def _int16s_at(typingctx, address):
    """The int16 array whose first element is at `address` (an array's data pointer), as a pointer for
    `numba.carray`: `_gather` reaches its sources through their addresses, since a typed List of them
    has methods numba compiles again in every process (a third of a second at each start)."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int16)))

    return types.CPointer(types.int16)(types.int64), codegen


@numba.njit(nogil=True, cache=True, parallel=True)
def _gather(addresses, sizes, source, start, unit, offset, signal_off, signal, text, at, ref_off, ref_seq):
    """Each record's samples in pA, (float32(raw[start[i]:]) + offset[i]) * unit[i] as `SignalRecord.to_pa`
    rounds them, raw being the `sizes[source[i]]` int16 samples at `addresses[source[i]]`, into
    signal[signal_off[i]:signal_off[i + 1]], and its reference bases, text[at[i]:], into
    ref_seq[ref_off[i]:ref_off[i + 1]].

    One call a batch: the GIL let go and taken back once (taking it back can wait a switch interval,
    5 ms, for a thread busy in Python). The records go to numba's threads one at a time: on the GPU box
    the one assembler thread spent 30 ms a batch here, serially, while the stages waited for its batches.
    The outputs come from numpy, which asks the kernel for huge pages: an array made here faulted its
    pages in one by one, five times the time of the arithmetic."""
    for i in numba.prange(source.shape[0]):
        o = signal_off[i]
        n = signal_off[i + 1] - o
        raw = numba.carray(_int16s_at(addresses[source[i]]), (sizes[source[i]],))
        src = raw[start[i] : start[i] + n]
        to = signal[o : o + n]
        u, z = unit[i], offset[i]
        for t in range(n):
            to[t] = (np.float32(src[t]) + z) * u
        r = ref_off[i]
        ref_seq[r : ref_off[i + 1]] = text[at[i] : at[i] + ref_off[i + 1] - r]


def offsets_of(length: np.ndarray) -> np.ndarray:
    """Offsets of runs of these lengths laid end to end: n + 1 of them, from 0 to the total."""
    off = np.zeros(len(length) + 1, np.int64)
    np.cumsum(length, out=off[1:])
    return off


def encode_all(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """ASCII strings end to end (one join, one encode; writable: direct RNA's stages turn U into T in place)
    and where each starts."""
    off = offsets_of(np.fromiter(map(len, texts), np.int64, len(texts)))
    return np.frombuffer(bytearray("".join(texts).encode("ascii")), np.uint8), off


def _gather_all(samples: Samples, ref: RefBases) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every record's samples in pA and reference bases, end to end, with their offsets: read where the
    readers and the reference left them, written straight into the batch."""
    signal_off, ref_off = offsets_of(samples.length), offsets_of(ref.length)
    signal, ref_seq = np.empty(signal_off[-1], np.float32), np.empty(ref_off[-1], np.uint8)
    if len(samples.source):
        raws = [np.ascontiguousarray(raw, np.int16) for raw in samples.sources]  # alive until _gather returns
        addresses = np.fromiter((raw.ctypes.data for raw in raws), np.int64, len(raws))
        sizes = np.fromiter(map(len, raws), np.int64, len(raws))
        with chunked(1):  # records of very different lengths
            _gather(addresses, sizes, samples.source, samples.start, samples.unit, samples.offset, signal_off,
                    signal, ref.text, ref.at, ref_off, ref_seq)  # fmt: skip
    return signal, signal_off, ref_seq, ref_off


def pack_records(alns: Sequence[Aligned], seqs: Sequence[str], samples: Samples, ref: RefBases, numbers: np.ndarray,
                 signal_paths: list[str]) -> ReadBatch:  # fmt: skip
    """Records into one batch of flat arrays: record i is `alns[i]`, its basecalls `seqs[i]`, its signal and
    reference bases the i-th of `samples` and `ref`, its `number` and the path of its signal file."""
    n = len(alns)
    seq, seq_off = encode_all(seqs)
    signal, signal_off, ref_seq, ref_seq_off = _gather_all(samples, ref)
    cigars = [np.asarray(a.cigar, dtype=np.int32).reshape(-1, 2) for a in alns]
    cigar_off = offsets_of(np.fromiter(map(len, cigars), np.int64, n))
    return ReadBatch(
        read_ids=[a.read_id for a in alns],
        ref_names=[a.ref_name for a in alns],
        signal_paths=signal_paths,
        seq=seq,
        seq_off=seq_off,
        signal=signal,
        signal_off=signal_off,
        sample_rate=samples.sample_rate,
        ref_start=np.fromiter((a.ref_start for a in alns), np.int64, n),
        ref_end=np.fromiter((a.ref_end for a in alns), np.int64, n),
        rc=np.fromiter((a.rc for a in alns), np.bool_, n),
        cigar=np.concatenate(cigars) if cigars else np.zeros((0, 2), np.int32),
        cigar_off=cigar_off,
        ref_seq=ref_seq,
        ref_seq_off=ref_seq_off,
        status=np.zeros(n, dtype=np.int8),
        numbers=np.asarray(numbers, np.int64),
        mapq=np.fromiter((a.mapq for a in alns), np.int64, n),
        ref_next=ref.next,
    )


def pack(reads: Sequence[ReadInput]) -> ReadBatch:
    """Pack reads into one batch of flat arrays."""
    return pack_records(reads, [r.seq for r in reads], Samples.of([r.signal for r in reads]),
                        RefBases.of([r.ref_seq for r in reads], [r.ref_next for r in reads]),
                        np.fromiter((r.number for r in reads), np.int64, len(reads)), [r.signal_path for r in reads])


def synthetic_read(model: PoreModel, n_bases: int = 600, samples_per_kmer: int = 9, seed: int = 7,
                   reverse: bool = False) -> ReadInput:  # fmt: skip
    """A read whose signal follows the model exactly (plus noise), aligned end to end to itself: what a
    pipeline's warm-up runs through every stage (`Pipeline.start`). `reverse`: its signal runs 3'->5', as
    direct RNA's does."""
    rng = np.random.default_rng(seed)
    seq = "".join(rng.choice(list("ACGT"), n_bases))
    ranks = [int(seq[i : i + model.k].translate(str.maketrans("ACGT", "0123")), 4) for i in range(n_bases - model.k + 1)]
    levels = np.repeat(model.level_mean[ranks[::-1] if reverse else ranks], samples_per_kmer)
    signal = levels + rng.normal(0, 1.0, len(levels))
    unit = 0.125  # pA per ADC step
    raw = np.round(signal / unit).astype(np.int16)
    return ReadInput(
        read_id="warm-up",
        seq=seq,
        signal=SignalRecord("warm-up", raw, digitisation=8.0, offset=0.0, range=1.0, sample_rate=4000.0),
        ref_name="synthetic",
        ref_start=0,
        ref_end=n_bases,
        rc=False,
        cigar=np.array([[CIGAR_M, n_bases]], dtype=np.int32),
        ref_seq=seq,
    )
