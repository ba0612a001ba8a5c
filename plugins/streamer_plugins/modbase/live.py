"""The daemon's live modkit table: the MM/ML calls of each basecall BAM as it lands, counted
into one `PileupCounts` and written as `modkit.bed`, byte for byte what `streamer pileup` writes
over the same BAMs with the same options.

The `modkit` sink (`live_sink`) decides which files are counted, once each, through the
daemon's ledger; this table only
counts what it is given (`add_file`), renders the whole table on `refresh`, and hands the
rows a file changed to the publisher (`take_changes`, absolute counts, as bedMethyl text says
them). Counts are a pure function of the set of files added, so a restart rebuilds the table
from its checkpoint (`save`, `load`: the counts with the files they hold) and the files counted
after it, or by adding the ledger's files again (`reset` first when a file must be taken back).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamer.errors import ConfigError, InputError
from streamer.sinks import write_atomic
from streamer_plugins.modbase.bedmethyl import Layout, expand, render
from streamer_plugins.modbase.caller import BASES, Thresholds, normalise_code, parse_filter_thresholds
from streamer_plugins.modbase.motifs import contig_sites, load_reference, parse_motifs
from streamer_plugins.modbase.pileup import CallOptions, PileupCounts, is_used
from streamer_plugins.modbase.reader import BamInputs, Sampling, estimate_thresholds, record_batches

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1
# bedMethyl columns as published (`meth.freq` version 2, source "dorado"); 4 is the mod code
FIELDS = ("chromosome", "start", "end", "mod_code", "score", "strand", "valid_coverage", "percent_modified",
          "count_modified", "count_canonical", "count_other_mod", "count_delete", "count_fail", "count_diff",
          "count_nocall")
_COLUMN = {name: i for i, name in enumerate(("chromosome", "start", "end", "mod_code", "score", "strand", "t0", "t1",
                                              "colour", "valid_coverage", "percent_modified", "count_modified",
                                              "count_canonical", "count_other_mod", "count_delete", "count_fail",
                                              "count_diff", "count_nocall"))}


@dataclass(frozen=True)
class LiveOptions:
    """`modcalls.*` of the daemon's configuration, as modkit pileup's options."""

    filter_threshold: tuple[str, ...] = ()
    filter_percentile: float = 0.1
    no_filtering: bool = False
    cpg: bool = True
    combine_strands: bool = False
    ignore: str | None = None
    combine_mods: bool = False

    def pileup_flags(self, thresholds: Thresholds) -> list[str]:
        """The `streamer pileup` (and `modkit pileup`) options that give the same table."""
        flags = ["--cpg"] if self.cpg else []
        flags += ["--combine-strands"] * self.combine_strands + ["--combine-mods"] * self.combine_mods
        flags += ["--ignore", self.ignore] if self.ignore else []
        return flags + threshold_flags(thresholds)


def threshold_flags(t: Thresholds) -> list[str]:
    if not t.per_base and not t.per_mod and t.default == 0.0:
        return ["--no-filtering"]
    flags = ["--filter-threshold", _f32(t.default)]
    for base, value in sorted(t.per_base.items()):
        flags += ["--filter-threshold", f"{BASES[base]}:{_f32(value)}"]
    for code, value in sorted(t.per_mod.items()):
        flags += ["--mod-threshold", f"{code}:{_f32(value)}"]
    return flags


def _f32(value: float) -> str:
    """The shortest text that reads back as the same single-precision threshold (calls compare in float32)."""
    return str(np.float32(value))


def thresholds_to_text(t: Thresholds) -> str:
    return json.dumps({"default": t.default, "per_base": {str(k): v for k, v in t.per_base.items()},
                       "per_mod": t.per_mod})


def thresholds_from_text(text: str) -> Thresholds:
    d = json.loads(text)
    return Thresholds(d["default"], {int(k): v for k, v in d["per_base"].items()}, d["per_mod"])


class LiveModTable:
    """`modkit.bed` of the BAMs added so far (the `modkit` sink's table, `live_sink.ModkitSink`)."""

    def __init__(self, path: Path, reference: Path, track_changes: bool = False, **options):
        self.path = Path(path)
        self.reference = Path(reference)
        self.options = options = LiveOptions(**options)
        if options.combine_strands and not options.cpg:
            raise ConfigError("modcalls.combine_strands needs modcalls.cpg")
        self.ignore = normalise_code(options.ignore) if options.ignore else None
        self.fixed = (Thresholds() if options.no_filtering else
                      parse_filter_thresholds(list(options.filter_threshold), None) if options.filter_threshold
                      else None)  # fmt: skip
        self.thresholds: Thresholds | None = self.fixed
        self.track_changes = track_changes
        self.counts: PileupCounts | None = None
        self.layout = Layout()
        self.dirty = False
        self._changed: list[np.ndarray] = []
        self.lock = threading.Lock()  # the publisher's thread renders snapshots while files are added
        self._contigs: list[tuple[str, int]] = []

    # ------------------------------------------------------------------ thresholds

    def estimate(self, bam: Path) -> Thresholds:
        """modkit's estimate (the `filter_percentile` quantile of call confidences) over one BAM's reads;
        no per-base thresholds for a BAM without modification tags."""
        inputs = BamInputs([bam])
        if not any(_has_mod_tags(rec) for rec, _ in inputs.records(None)):
            return Thresholds()
        sampling = Sampling(self.options.filter_percentile, ignore=self.ignore)
        return Thresholds(0.0, estimate_thresholds(inputs, sampling, None).per_base)

    def use_thresholds(self, thresholds: Thresholds) -> None:
        if self.counts is not None:
            raise RuntimeError("thresholds are set before the first file is counted")
        self.thresholds = thresholds

    @property
    def thresholds_text(self) -> str | None:
        """The thresholds in use, as the ledger keeps them (None until set)."""
        return thresholds_to_text(self.thresholds) if self.thresholds is not None else None

    def restore_thresholds(self, text: str) -> None:
        """The thresholds estimated earlier in this run (fixed ones in the configuration win)."""
        if self.fixed is None:
            self.use_thresholds(thresholds_from_text(text))

    def describe(self) -> str:
        """The `streamer pileup` options that reproduce the table offline."""
        return " ".join(self.options.pileup_flags(self.thresholds)) if self.thresholds is not None else ""

    # ------------------------------------------------------------------ counting

    def reset(self) -> None:
        """Forget every count (the caller adds the files it keeps again)."""
        self.counts = None
        self.dirty = True
        self._changed.clear()

    def add_file(self, bam: Path) -> tuple[int, int]:
        """Count one BAM's calls in one pass; (reads, calls) counted. Batches without MM/Mm tags (all of
        them in most runs, before dorado calls modifications) are only counted as reads: they hold no
        calls, and the kernels, which compile on first use, are not started for them. Raises InputError
        for a file that cannot be read through (the counts may then hold part of it: the caller resets
        and re-adds what it keeps)."""
        if self.thresholds is None:
            raise RuntimeError("no pass thresholds: estimate them first")
        inputs = BamInputs([bam])
        reads = calls = 0
        for batch in record_batches(inputs):
            if not any(_has_mod_tags(rec) for rec, _ in batch):
                reads += _used(batch)
                continue
            counts = self._counts_for(bam, inputs.contigs)
            before = counts.n_reads
            with self.lock:
                calls += counts.add(batch)
            reads += counts.n_reads - before
            self._note(counts)
            self.dirty = True
        return reads, calls

    def _counts_for(self, bam: Path, contigs: list[tuple[str, int]]) -> PileupCounts:
        if self.counts is None:
            sites = self._set_layout(contigs)
            options = CallOptions(self.thresholds, self.ignore, self.options.combine_mods)
            self.counts = PileupCounts(contigs, options, sites)
        elif contigs != self._contigs:
            raise InputError(bam, "its contigs differ from those of the run's first BAM; its calls are not counted")
        return self.counts

    def _set_layout(self, contigs: list[tuple[str, int]]):
        """The motif sites of the contigs (None without `cpg`) and the rows' layout."""
        motifs = parse_motifs(None, self.options.cpg)
        sites = None
        if motifs:
            reference = load_reference(self.reference, [n for n, _ in contigs])
            sites = {name: contig_sites(motifs, seq, self.options.combine_strands) for name, seq in reference.items()}
        self.layout = Layout(tuple(motifs), sites, self.options.combine_strands)
        self._contigs = contigs
        return sites

    # ------------------------------------------------------------------ checkpoint

    def save(self, path: Path, files: object) -> None:
        """The counts, with `files` (what the caller says they hold), replacing `path` whole."""
        with self.lock:
            state = {"version": CHECKPOINT_VERSION, "options": self.options, "thresholds": self.thresholds_text,
                     "contigs": self._contigs, "counts": self.counts, "files": files}
            data = pickle.dumps(state, protocol=5)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def load(self, path: Path) -> object | None:
        """The counts a checkpoint of this run holds, and the `files` saved with them; None (and the
        counts untouched) when there is none, or it was made with other options or thresholds."""
        try:
            state = pickle.loads(Path(path).read_bytes())
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - a damaged checkpoint is rebuilt from the BAMs
            log.warning("%s: not a usable checkpoint (%s); the counts are rebuilt from the BAMs", path, exc)
            return None
        if (state.get("version") != CHECKPOINT_VERSION or state["options"] != self.options
                or state["thresholds"] != self.thresholds_text or state["counts"] is None):
            return None
        self.counts = state["counts"]
        self._set_layout(state["contigs"])
        self.dirty = True
        return state["files"]

    def _note(self, counts: PileupCounts) -> None:
        if self.track_changes and len(counts.touched):
            self._changed.append(counts.touched)

    # ------------------------------------------------------------------ outputs

    @property
    def n_calls(self) -> int:
        return self.counts.n_calls if self.counts is not None else 0

    def text(self, blocks: np.ndarray | None = None) -> str:
        with self.lock:
            if self.counts is None:
                return ""
            rows = self.counts.rows(blocks)
        return render(expand(rows, self.counts, self.layout), self.counts, self.layout)

    def refresh(self) -> None:
        if self.dirty and self.counts is not None:
            write_atomic(self.path, self.text())
            self.dirty = False

    def take_changes(self) -> dict[str, list] | None:
        """The current rows of the sites the files added since the last call reached, as `FIELDS`
        columns (None when none): bedMethyl's own numbers, so a subscriber's table is the file's."""
        if not self._changed or self.counts is None:
            self._changed.clear()
            return None
        blocks = np.unique(np.concatenate(self._changed))
        self._changed.clear()
        if self.options.combine_strands:  # a combined row sums sites that may sit on either side of a block edge
            blocks = np.unique(np.concatenate([blocks - 1, blocks, blocks + 1]))
            blocks = np.intersect1d(blocks, self.counts.store.allocated())
        return columns_of(self.text(blocks))

    def snapshot_columns(self) -> dict[str, list] | None:
        """Every row as `FIELDS` columns (the publisher's snapshot for late joiners)."""
        return columns_of(self.text())


def columns_of(text: str) -> dict[str, list] | None:
    """bedMethyl lines as `FIELDS` columns (numbers as numbers)."""
    lines = text.splitlines()
    if not lines:
        return None
    cells = [line.replace(" ", "\t").split("\t") for line in lines]
    out: dict[str, list] = {}
    for name in FIELDS:
        i = _COLUMN[name]
        column = [c[i] for c in cells]
        if name in ("chromosome", "mod_code", "strand"):
            out[name] = column
        elif name == "percent_modified":
            out[name] = [float(x) for x in column]
        else:
            out[name] = [int(x) for x in column]
    return out


def tagless_reads(bam: Path) -> int | None:
    """The reads `add_file` counts in a BAM none of whose records carries MM tags (most runs' BAMs); None
    when one does. A module function with a small answer: the daemon reads the file in its parsing process,
    off the GIL its engine shares with the stages (`streamer.sinks.SinkContext.begin`)."""
    batch = list(BamInputs([bam]).records(None))
    return None if any(_has_mod_tags(rec) for rec, _ in batch) else _used(batch)


def _used(batch: list) -> int:
    return sum(1 for rec, _ in batch if is_used(rec))


def _has_mod_tags(rec) -> bool:
    """Whether a record carries MM (or the old Mm) tags: a look at the tags, before any parsing."""
    return rec.has_tag("MM") or rec.has_tag("Mm")
