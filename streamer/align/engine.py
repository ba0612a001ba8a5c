"""The aligner of the `cpu` and `gpu` engines: seeds, chains, base-level extension, SAM records.

It has the interface of the mappy aligner (`streamer.daemon.aligner.ReadAligner`): `records` and
`align` for one read, `records_all` and `align_all` for a batch, `header`, `threads`. A batch goes
through each step whole: its reads' bases laid end to end, seeded in one call (the seeder is given:
the FM-index's, on the GPU or the CPU, or any callable of the same shape), chained in one call and
extended, both on the GPU for `target` "gpu" (the CPU where there is none), else chained on the CPU and
extended on `threads` threads. A base other than A, C, G, T is code 4: no seed spans it, and the
extension scores it as N.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pysam

from streamer.align.agreement import EngineChoice
from streamer.align.anchors import Seeds
from streamer.align.bases import encode
from streamer.align.chain import SECONDARY, ChainParams, chain
from streamer.align.extend import ExtendParams, extend
from streamer.align.genome import read_fasta
from streamer.align.records import Placed, Texts, batch_records, judged
from streamer.daemon.basecall_cache import Record
from streamer.errors import InputError
from streamer.io.alignments import AlignmentFilter
from streamer.pipeline.gpu import gpu_package

log = logging.getLogger(__name__)

Seeder = Callable[[np.ndarray, np.ndarray], Seeds]  # (base codes laid end to end, offsets[n + 1]) -> Seeds
# raised with any change to the seeding, chaining or extension that can move an alignment, so that the `auto`
# engine's checks kept beside FM-indexes (`streamer.daemon.aligner`) are run again
ENGINE_VERSION = 1


@dataclass(frozen=True)
class EngineParams:
    min_len: int | None = None  # shortest seed (None: the seeding's default)
    max_occ: int | None = None  # seeds with more places on the reference than this are left out (None: its default)
    chain: ChainParams = field(default_factory=ChainParams)
    extend: ExtendParams = field(default_factory=ExtendParams)


class SeedAligner:
    """Reads aligned to the contigs `(name, codes)` with seeds from `seeder`."""

    choice: EngineChoice | None = None  # why this engine, where `streamer.daemon.aligner.open_aligner` chose it

    def __init__(self, contigs: list[tuple[str, np.ndarray]], seeder: Seeder, filt: AlignmentFilter, *,
                 params: EngineParams = EngineParams(), threads: int = 2, source: str = "streamer align",
                 target: str = "cpu"):
        self.names = [name for name, _ in contigs]
        lengths = [len(codes) for _, codes in contigs]
        self.genome = np.concatenate([codes for _, codes in contigs]) if contigs else np.zeros(0, np.uint8)
        self.contig_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.header = pysam.AlignmentHeader.from_references(self.names, lengths)
        self.threads = threads
        self._seed = seeder
        self._params = params
        self._filt = filt
        self._source = source
        self._target = target  # where chaining runs: "cpu" or "gpu"
        self._gpu = gpu_package().extender(self.genome) if target == "gpu" else None  # extension's DP there
        self.seconds = dict.fromkeys(("seed", "chain", "extend"), 0.0)  # time spent in each step, summed

    def placed(self, seqs: Texts) -> Placed:
        """The alignments of reads `seqs` (as basecalled): by read, primary first, then supplementary parts,
        then secondaries."""
        codes = encode(seqs.data)
        offsets = seqs.off
        lengths = np.diff(offsets)
        t0 = time.perf_counter()
        seeds = self._seed(codes, offsets)
        t1 = time.perf_counter()
        chains = chain(seeds, lengths, self.contig_offsets, self._params.chain, target=self._target)
        t2 = time.perf_counter()
        al = extend(chains, seeds, codes, offsets, self.genome, self.contig_offsets, self._params.extend,
                    threads=self.threads, gpu=self._gpu)
        t3 = time.perf_counter()
        for step, dt in zip(self.seconds, (t1 - t0, t2 - t1, t3 - t2)):
            self.seconds[step] += dt
        o = _primary_first(chains.read, chains.role, al.score)
        rc, contig = chains.rc[o], chains.contig[o].astype(np.int64)
        read_len = lengths[chains.read[o]]
        qstart, qend = al.qstart[o], al.qend[o]
        return Placed(read=chains.read[o].astype(np.int64), contig=contig,
                      r_st=al.rstart[o] - self.contig_offsets[contig], q_st=np.where(rc, read_len - qend, qstart),
                      q_en=np.where(rc, read_len - qstart, qend), reverse=rc, mapq=chains.mapq[o].astype(np.int64),
                      is_primary=chains.role[o] != SECONDARY, nm=al.nm[o], cigar=al.cigar,
                      cigar_start=al.cigar_off[o], cigar_end=al.cigar_off[o + 1])

    def records_all(self, reads: Sequence[tuple[str, str]]) -> list[list[pysam.AlignedSegment]]:
        """The SAM records of each (read id, sequence): primary first, then supplementary and secondary."""
        if not reads:
            return []
        ids, seqs = Texts.of([rid for rid, _ in reads]), Texts.of([seq for _, seq in reads])
        return batch_records(self.header, ids, seqs, self.placed(seqs))

    def records(self, read_id: str, seq: str) -> list[pysam.AlignedSegment]:
        return self.records_all([(read_id, seq)])[0]

    def align_all(self, reads: Sequence[tuple[str, str]]) -> list[tuple[Record, ...]]:
        """Each read's records as the filter judges them; one unmapped record for a read with none."""
        return [judged(rid, recs, self._filt, self._source) for (rid, _), recs in zip(reads, self.records_all(reads))]

    def align(self, read_id: str, seq: str) -> tuple[Record, ...]:
        return self.align_all([(read_id, seq)])[0]


def _primary_first(read: np.ndarray, role: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Chains in output order: by read, the read's parts that are not secondaries by their base-level score
    (the best is the primary, as minimap2 ranks them after aligning), then its secondaries by score."""
    return np.lexsort((-score, role == SECONDARY, read))


def fm_aligner(genome: Path, filt: AlignmentFilter, *, target: str, params: EngineParams = EngineParams(),
               threads: int = 2) -> SeedAligner:
    """The `cpu` or `gpu` engine: the FM-index of `genome` (loaded from beside it, or built there on
    `target`), its maximal exact match seeds and their chains on `target`."""
    from streamer.align.fmindex import load_or_build
    from streamer.align.seeds import find_seeds

    contigs = read_fasta(genome)  # read once: the extension's reference, and the index's text if it is built
    index = load_or_build(genome, target=target, contigs=contigs)
    offsets = np.concatenate([[0], np.cumsum([len(c) for _, c in contigs])])
    if tuple(index.names) != tuple(n for n, _ in contigs) or not np.array_equal(index.contig_offsets, offsets):
        raise InputError(genome, "its FM-index holds other contigs: remove the index to build it again")
    limits = {k: v for k, v in (("min_len", params.min_len), ("max_occ", params.max_occ)) if v is not None}

    def seeder(codes: np.ndarray, offsets: np.ndarray) -> Seeds:
        return find_seeds(index, codes, offsets, target=target, **limits)

    log.info("%s alignment engine ready: FM-index of %s (%d contigs)", target, genome, len(contigs))
    return SeedAligner(contigs, seeder, filt, params=params, threads=threads, source=f"streamer align ({target})",
                       target=target)
