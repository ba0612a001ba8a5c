"""BAM input for the pileup: records of several files in one stream, and the threshold sample.

Coordinate-sorted inputs are merged in coordinate order, so finished sites can be written and
freed as the stream moves on; other inputs are read one after the other. A file that ends
early or is corrupt logs one line naming it and the last read read, and the reads before it
count.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import random
import warnings
from collections.abc import Iterator
from itertools import chain
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pysam

from streamer.errors import ConfigError, InputError
from streamer_plugins.modbase.caller import Thresholds, argmax_probability, percentile
from streamer_plugins.modbase import fastcalls
from streamer_plugins.modbase.parsed import offsets, parse_records
from streamer_plugins.modbase.tags import ModTagError, forward_codes
from streamer_plugins.modbase.pileup import usable_groups

log = logging.getLogger("streamer.pileup")
_UNMAPPED_KEY = 1 << 62
BATCH_READS = 2000  # records per call of the counting kernels: large enough to amortise, small in memory


@dataclass(frozen=True)
class Region:
    contig: str
    start: int
    end: int


def parse_region(raw: str, contigs: dict[str, int]) -> Region:
    """`chrom` or `chrom:start-end` (0-based, end exclusive, commas allowed), as modkit reads it."""
    if ":" not in raw:
        if raw not in contigs:
            raise ConfigError(f"--region {raw}: no such contig in the BAM header")
        return Region(raw, 0, contigs[raw])
    name, _, span = raw.rpartition(":")
    try:
        start, end = (int(x.replace(",", "")) for x in span.split("-"))
    except ValueError:
        raise ConfigError(f"--region {raw}: expected CHROM:START-END") from None
    if end <= start or start < 0:
        raise ConfigError(f"--region {raw}: end must be after start")
    if name not in contigs:
        raise ConfigError(f"--region {raw}: no such contig in the BAM header")
    return Region(name, start, end)


class BamInputs:
    """Several BAMs over the same contigs, read as one stream of records."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.contigs: list[tuple[str, int]] | None = None
        sorted_flags = []
        for path in paths:
            with _open(path) as bam:
                contigs = list(zip(bam.references, bam.lengths))
                if self.contigs is None:
                    self.contigs = contigs
                elif contigs != self.contigs:
                    raise InputError(path, f"its contigs differ from those of {paths[0]}")
                sorted_flags.append(bam.header.to_dict().get("HD", {}).get("SO") == "coordinate")
        self.sorted = all(sorted_flags)

    def records(self, region: Region | None = None, mapped_only: bool = True) -> Iterator[tuple[pysam.AlignedSegment, Path]]:
        """Records of every file (coordinate order when all are sorted), tagged with their file."""
        streams = [_records(p, region, mapped_only) for p in self.paths]
        if not self.sorted:
            for stream in streams:
                yield from stream
            return
        yield from heapq.merge(*streams, key=_coordinate)


def record_batches(inputs: BamInputs, region: Region | None = None) -> Iterator[list[tuple[pysam.AlignedSegment, str]]]:
    """The inputs' (record, source file) pairs in batches of `BATCH_READS`, the unit `PileupCounts.add` takes."""
    batch: list[tuple[pysam.AlignedSegment, str]] = []
    for rec, path in inputs.records(region):
        batch.append((rec, str(path)))
        if len(batch) >= BATCH_READS:
            yield batch
            batch = []
    if batch:
        yield batch


def _coordinate(item) -> tuple[int, int]:
    rec = item[0]
    return (rec.reference_id, rec.reference_start) if rec.reference_id >= 0 else (_UNMAPPED_KEY, 0)


def _open(path: Path) -> pysam.AlignmentFile:
    """The BAM, opened even without its end-of-file marker (a truncation is reported where reading stops)."""
    pysam.set_verbosity(0)  # htslib's own messages would add lines to the one we log
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return pysam.AlignmentFile(str(path), "rb", check_sq=False, ignore_truncation=True)
    except (OSError, ValueError) as exc:
        raise InputError(path, f"cannot read as BAM: {exc}") from None


def _records(path: Path, region: Region | None, mapped_only: bool):
    last = None
    bam = _open(path)
    with contextlib.suppress(OSError), contextlib.closing(bam):
        try:
            if region is not None and bam.has_index():
                it = bam.fetch(region.contig, region.start, region.end)
            else:
                it = bam.fetch(until_eof=True)
            for rec in it:
                if region is not None and (rec.reference_name != region.contig or rec.reference_end is None
                                           or rec.reference_end <= region.start or rec.reference_start >= region.end):
                    continue
                if mapped_only and rec.is_unmapped:
                    continue
                last = rec.query_name
                yield rec, path
        except (OSError, ValueError) as exc:
            after = f"after read {last}" if last else "before its first read"
            log.warning("%s: unreadable %s (%s); the reads before it are counted", path, after, exc)


@dataclass(frozen=True)
class Sampling:
    """How reads are sampled to estimate the pass threshold (modkit's -n, -f, --seed, -p, --include-unmapped)."""

    percentile: float = 0.1
    num_reads: int = 10_042
    fraction: float | None = None
    seed: int | None = None
    include_unmapped: bool = False
    ignore: str | None = None


def estimate_thresholds(inputs: BamInputs, sampling: Sampling, region: Region | None) -> Thresholds:
    """Per primary base, the `percentile` quantile of the most likely class's probability over sampled reads.

    With `-f`, each read is kept with that probability; otherwise about `-n` reads drawn
    uniformly from the input (all reads when there are fewer, as in modkit; a larger input is
    sampled with streamer's own generator, so the estimate can differ slightly from modkit's).
    """
    rng = random.Random(sampling.seed)
    chosen = None
    if sampling.fraction is None:
        total = sum(1 for _ in inputs.records(region, mapped_only=not sampling.include_unmapped))
        if total > sampling.num_reads:
            chosen = set(rng.sample(range(total), sampling.num_reads))
    seen: set[str] = set()
    per_base: dict[int, list[np.ndarray]] = {}
    batch: list[pysam.AlignedSegment] = []
    records = inputs.records(region, mapped_only=not sampling.include_unmapped)
    for i, (rec, _) in enumerate(records):
        if chosen is not None and i not in chosen:
            continue
        if rec.is_secondary or rec.is_supplementary or rec.is_duplicate or not rec.query_length:
            continue
        if sampling.fraction is not None and rng.random() >= sampling.fraction:
            continue
        batch.append(rec)
        if len(batch) >= 2000:
            _sample(batch, sampling, seen, per_base)
            batch = []
    _sample(batch, sampling, seen, per_base)
    thresholds = {b: percentile(np.concatenate(v), sampling.percentile) for b, v in per_base.items()}
    return Thresholds(0.0, thresholds, {})  # the caller says what it estimated: the daemon in its own line


def _sample(records: list[pysam.AlignedSegment], sampling: Sampling, seen: set[str], per_base: dict) -> None:
    """Add the most-likely-class probabilities of each record (the first of each read name) to per_base."""
    if not records:
        return
    parsed = parse_records(records) if sampling.ignore is None else None
    aligned = None
    if parsed is not None and not sampling.include_unmapped:
        cigars = [rec.cigartuples or [] for rec in records]
        cig = np.fromiter(chain.from_iterable(chain.from_iterable(cigars)), np.int64,
                          count=2 * sum(len(c) for c in cigars)).reshape(-1, 2)
        aligned = np.zeros(len(parsed.seq), np.bool_)
        fastcalls.aligned_forward(offsets([len(c) for c in cigars]), cig, parsed.seq_off, parsed.rev, aligned)
    if parsed is not None:
        g = parsed.groups
        canonical = np.float32(1) - parsed.probs.sum(axis=1, dtype=np.float32)
        best = parsed.probs.max(axis=1)
        value = np.where(best > canonical, best, canonical)
        tb = parsed.threshold_base()
        by_read = np.searchsorted(g["read"], np.arange(len(records) + 1))
    for i, rec in enumerate(records):
        if rec.query_name in seen:
            continue
        if parsed is None or parsed.status[i] == fastcalls.SLOW:
            values = _read_values(rec, sampling)
        else:
            groups = range(by_read[i], by_read[i + 1])
            if not any(g["pos_end"][k] > g["pos_off"][k] for k in groups):
                continue  # no calls at all: modkit leaves the read out
            parts: dict[int, list[np.ndarray]] = {}
            for k in groups:
                a, b = g["pos_off"][k], g["pos_end"][k]
                v = value[a:b]
                if aligned is not None:
                    v = v[aligned[parsed.seq_off[i] + parsed.positions[a:b]]]
                parts.setdefault(int(tb[k]), []).append(v)
            values = {base: np.concatenate(v) for base, v in parts.items()}
        if values is None:
            continue
        seen.add(rec.query_name)
        for base, v in values.items():
            per_base.setdefault(base, []).append(v)


def _read_values(rec: pysam.AlignedSegment, sampling: Sampling) -> dict[int, np.ndarray] | None:
    fseq = forward_codes(rec)
    try:
        groups, _ = usable_groups(rec, fseq, sampling.ignore)
    except ModTagError:
        return None
    aligned = None
    if not sampling.include_unmapped:
        aligned = np.zeros(len(fseq), bool)
        q = 0
        for op, length in rec.cigartuples or ():
            if op in (0, 7, 8):
                aligned[q:q + length] = True
            if op in (0, 1, 4, 7, 8):
                q += length
        if rec.is_reverse:
            aligned = aligned[::-1]
    out: dict[int, list[np.ndarray]] = {}
    for g in groups:
        values = argmax_probability(g.probs)
        if aligned is not None:
            values = values[aligned[g.positions]]
        out.setdefault(g.threshold_base, []).append(values)
    return {b: np.concatenate(v) for b, v in out.items()}
