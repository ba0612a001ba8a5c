"""Base-space alignment of basecalls that come without one, with mappy (minimap2's own binding), or
the engine `alignment.engine` names.

Each hit becomes the BAM record minimap2 would write for it (`streamer.align.records`), so the
same filter and the same `Alignment` conversion apply as to an aligned BAM, and `streamer call`
on a BAM of these records gives the same rows. `auto` is decided here, at the edge: whether a GPU is
there, the check of `streamer.align.agreement` run once per FM-index and kept beside it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict
from itertools import islice
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mappy
import numpy as np
import pysam

import streamer
from streamer.align.agreement import Agreement, EngineChoice, agreement, asked_for, check_reads, choose_engine
from streamer.align.fmindex import index_path, index_stamp
from streamer.align.records import hit_arrays, judged, sam_records
from streamer.align.engine import ENGINE_VERSION, SeedAligner, fm_aligner
from streamer.errors import InputError, StreamerError, UsageError
from streamer.pipeline.gpu import gpu_package
from streamer.io.alignments import AlignmentFilter
from streamer.daemon.basecall_cache import Record

log = logging.getLogger(__name__)
WARM_UP_READS = 16
RECORDS_CHUNK = 256  # reads whose records are made at once, while the next reads' hits are found


class ReadAligner:
    """A minimap2 index, built once from the reference (or loaded from a `.mmi`)."""

    choice: EngineChoice | None = None  # why this engine, where `open_aligner` chose it

    def __init__(self, genome: Path, filt: AlignmentFilter, *, index: Path | None = None, preset: str = "map-ont",
                 threads: int = 3):
        source = index or genome
        self._aligner = mappy.Aligner(str(source), preset=preset, n_threads=threads)
        if not self._aligner:
            raise InputError(source, "cannot load or build a minimap2 index")
        self._filt = filt
        self.threads = threads
        names = list(self._aligner.seq_names)
        lengths = [len(self._aligner.seq(n)) for n in names]
        self.header = pysam.AlignmentHeader.from_references(names, lengths)
        log.info("minimap2 index of %s ready (%s, %d sequences)", source, preset, len(names))

    def records(self, read_id: str, seq: str) -> list[pysam.AlignedSegment]:
        """The SAM records of one read: primary first, then supplementary and secondary."""
        return self.records_all([(read_id, seq)])[0]

    def align(self, read_id: str, seq: str) -> tuple[Record, ...]:
        """Each record as the filter judges it; one unmapped record if minimap2 finds no hit."""
        return judged(read_id, self.records(read_id, seq), self._filt, "minimap2 (mappy)")

    def records_all(self, reads: Sequence[tuple[str, str]]) -> list[list[pysam.AlignedSegment]]:
        """`records` over (read id, sequence) pairs: their hits found on `threads` threads (mappy releases the
        GIL), their records made RECORDS_CHUNK reads at a time as the hits come."""
        seqs = (seq for _, seq in reads)
        if len(reads) < 2 or self.threads < 2:
            return self._records(reads, map(self._hit_arrays, seqs))
        with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="mappy") as pool:
            return self._records(reads, pool.map(self._hit_arrays, seqs))

    def _hit_arrays(self, seq: str) -> tuple[np.ndarray, np.ndarray]:
        return hit_arrays(self.header, self._aligner.map(seq))

    def _records(self, reads: Sequence[tuple[str, str]], arrays: Iterator[tuple[np.ndarray, np.ndarray]]
                 ) -> list[list[pysam.AlignedSegment]]:  # fmt: skip
        out = []
        for i in range(0, len(reads), RECORDS_CHUNK):
            chunk = reads[i:i + RECORDS_CHUNK]
            out += sam_records(self.header, chunk, list(islice(arrays, len(chunk))))
        return out

    def align_all(self, reads: Sequence[tuple[str, str]]) -> list[tuple[Record, ...]]:
        """`align` over (read id, sequence) pairs on `threads` threads."""
        return [judged(rid, recs, self._filt, "minimap2 (mappy)")
                for (rid, _), recs in zip(reads, self.records_all(reads))]


def aligned_records(aligner: ReadAligner | SeedAligner, reads: Iterable[tuple[str, str]], chunk: int
                    ) -> Iterator[Record]:  # fmt: skip
    """Each (read id, sequence)'s records as the aligner's filter judges them (`align_all`), in read order,
    `chunk` reads aligned at a time as the records are taken: millions of reads, one chunk in memory."""
    reads = iter(reads)
    while batch := list(islice(reads, chunk)):
        for records in aligner.align_all(batch):
            yield from records


def open_aligner(engine: str, genome: Path, filt: AlignmentFilter, *, index: Path | None = None,
                 preset: str = "map-ont", threads: int = 3) -> ReadAligner | SeedAligner:
    """The aligner of `alignment.engine`: mappy (`index`, `preset`), the FM-index engine seeding on the
    `gpu` or the `cpu`, or for `auto` the gpu engine where a GPU is there and it passes the check against
    mappy, else mappy (said in one line). The aligner's `choice` says which and why."""
    if engine == "auto":
        return _warmed(_auto(genome, filt, index=index, preset=preset, threads=threads))
    aligner = _opened(engine, genome, filt, index=index, preset=preset, threads=threads)
    aligner.choice = asked_for(engine)
    return _warmed(aligner)


def _warmed(aligner: ReadAligner | SeedAligner) -> ReadAligner | SeedAligner:
    """The engine's kernels compiled (the GPU's on their first launch) on a few of the check's reads as it
    opens, not on the first batch of reads: on a fresh machine that took a daemon's first batch 17 s."""
    if isinstance(aligner, SeedAligner):
        aligner.records_all(check_reads(aligner.names, aligner.genome, aligner.contig_offsets, n=WARM_UP_READS))
    return aligner


def _opened(engine: str, genome: Path, filt: AlignmentFilter, *, index: Path | None, preset: str,
            threads: int) -> ReadAligner | SeedAligner:  # fmt: skip
    if engine == "mappy":
        return ReadAligner(genome, filt, index=index, preset=preset, threads=threads)
    try:
        return fm_aligner(genome, filt, target=engine, threads=threads)
    except ImportError as exc:
        raise UsageError(f"the {engine} alignment engine cannot start: {exc} (use the mappy engine)") from None


def _auto(genome: Path, filt: AlignmentFilter, *, index: Path | None, preset: str, threads: int
          ) -> ReadAligner | SeedAligner:  # fmt: skip
    """The gpu engine, checked against mappy once per index (the result kept beside it), or mappy."""
    mappy_aligner: ReadAligner | None = None
    gpu: SeedAligner | None = None
    no_gpu, check, kept = why_no_gpu(), None, None
    if not no_gpu:
        check = kept = _kept_check(genome, _check_key(genome, index, preset))
        if check is None or check.passed:  # a kept failure needs no gpu engine
            try:
                gpu = fm_aligner(genome, filt, target="gpu", threads=threads)
            except ImportError as exc:
                no_gpu = f"the gpu engine cannot start: {exc}"
        if gpu is not None and check is None:
            mappy_aligner = ReadAligner(genome, filt, index=index, preset=preset, threads=threads)
            reads = check_reads(gpu.names, gpu.genome, gpu.contig_offsets)
            check = agreement(mappy_aligner.records_all(reads), gpu.records_all(reads))
            _keep_check(genome, _check_key(genome, index, preset), check)  # the index is there now
    choice = choose_engine(no_gpu, check)
    log.info("%s%s", choice.line(), f"; checked before, as kept in {check_path(genome)}" if kept is not None else "")
    if choice.engine == "gpu" and gpu is not None:
        aligner: ReadAligner | SeedAligner = gpu
    else:
        aligner = mappy_aligner or ReadAligner(genome, filt, index=index, preset=preset, threads=threads)
    aligner.choice = choice
    return aligner


def why_no_gpu() -> str:
    """Why the gpu engine has no GPU here ("" where there is one)."""
    try:
        found = gpu_package().count_gpus()
    except (StreamerError, ImportError) as exc:
        return f"no GPU package: {exc}"
    return "" if found else "no GPU on this host"


def check_path(genome: Path) -> Path:
    """Where the `auto` engine's check of a reference's FM-index is kept: beside the index."""
    fmi = index_path(genome)
    return fmi.with_name(fmi.name + ".check.json")


def _check_key(genome: Path, index: Path | None, preset: str) -> dict | None:
    """What the check's result holds for: this index's content (the reference's digest and the index's
    layout, so a fresh clone's copy holds), this engine's and mappy's versions, mappy's settings; None
    where no index of this reference is kept (nor then the check)."""
    stamp = index_stamp(genome)
    if stamp is None:
        return None
    return {"index": stamp, "engine": f"{streamer.__version__}/{ENGINE_VERSION}",
            "mappy": getattr(mappy, "__version__", ""), "preset": preset, "mm_index": str(index or "")}


def _kept_check(genome: Path, key: dict | None) -> Agreement | None:
    """The check kept for this key, if any."""
    if key is None:
        return None
    try:
        kept = json.loads(check_path(genome).read_text())
        return Agreement(**kept["result"]) if kept["key"] == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _keep_check(genome: Path, key: dict | None, check: Agreement) -> None:
    if key is None:
        return
    path = check_path(genome)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"key": key, "result": asdict(check)}, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not keep the alignment engine's check beside %s (%s): it runs again next time", genome,
                    exc)  # fmt: skip
    finally:
        tmp.unlink(missing_ok=True)
