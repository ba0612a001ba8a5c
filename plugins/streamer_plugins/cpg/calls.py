"""Methylation calls for a batch, and their nanopolish/f5c call-methylation TSV rows.

`call_methylation` takes a batch whose events, recalibrated scalings, ABEA pairs and alignment
fields are filled, and a motif (`streamer.pore.motifs`: CpG, GpC, dam, dcm). It plans the scored
windows of every read in parallel (event-to-reference map, groups of motif sites, bounding events),
then scores all (read, window) jobs of the batch in one parallel pass, so long and short reads share
the cores evenly.

`_plan_windows` is a numba kernel over the batch's flat arrays, hence its long argument list;
`_plan_jobs` unpacks the batch record for it once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numba
import numpy as np

from streamer.pipeline import timeline
from streamer.pipeline.batch import ReadBatch
from streamer.pipeline.postalign import EventMap, event_map
from streamer_plugins import printf
from streamer_plugins.cpg import tsv
from streamer_plugins.cpg.hmm import HmmInputs, HmmJobs, score_jobs
from streamer_plugins.cpg.hmm_model import (HmmParams, nanopolish_scaling, pack_model, pack_model64, pack_scalings,
                                             pack_scalings64)
from streamer_plugins.cpg.logsum import LOGSUM_TABLE
from streamer_plugins.cpg.lookup import CLOSEST_EVENT_SEARCH, is_spliced
from streamer_plugins.cpg.sites import (
    MAX_SPAN,
    MIN_EVENT_SPAN,
    MIN_SEPARATION,
    ReadSites,
    batch_sites,
    group_slots,
    read_windows,
)
from streamer_plugins.texts import Texts
from streamer.pore.model import METHYL_CPG, NUCLEOTIDE, PoreModel
from streamer.pore.motifs import CPG, Motif
from streamer.skips import Skip

CALLS_HEADER = (
    "chromosome\tstrand\tstart\tend\tread_name\tlog_lik_ratio\tlog_lik_methylated"
    "\tlog_lik_unmethylated\tnum_calling_strands\tnum_motifs\tsequence\n"
)

# Planning outcome of a read whose alignment skips reference (0 otherwise).
_PLAN_SPLICED = 1


@dataclass
class MethCalls:
    """One row per scored group of motif sites, ordered by read, then reference position."""

    read: np.ndarray  # int64: index of the alignment record in the batch
    start: np.ndarray  # int64: 0-based reference position of the group's first site (its first base)
    end: np.ndarray  # int64: 0-based reference position of the group's last site
    strand: np.ndarray  # int8: +1 forward, -1 reverse
    llr: np.ndarray  # float64: ll_meth - ll_unmeth
    ll_meth: np.ndarray  # float64
    ll_unmeth: np.ndarray  # float64
    num_motifs: np.ndarray  # int32: sites in the group
    sequence: Texts  # reference from k-1 before the first site to k after the last site

    def __len__(self) -> int:
        return len(self.read)


@dataclass(frozen=True)
class Grouping:
    """How motif sites are grouped into scored windows, and how far events are looked for (f5c's values)."""

    min_separation: int = MIN_SEPARATION  # bases between groups; the flank either side of a window
    max_span: int = MAX_SPAN  # most bases between a group's first and last site
    min_event_span: int = MIN_EVENT_SPAN  # a window's bounding events must be further apart than this
    event_search: int = CLOSEST_EVENT_SEARCH


@numba.njit(parallel=True, nogil=True, cache=True)
def _plan_windows(
    site_at, site_off, ref_start, rc, cigar, cigar_off, seq_off, b2e_start, kmer_off, status,
    slot_off, k, search, min_separation, max_span, min_event_span,
):  # fmt: skip
    """Each read's kept windows, found into its slots (as many as its span can hold groups: `group_slots`),
    then one read after another: the batch's jobs (read, first, last, n_sites, e1, e2), the number kept per
    read and a per-read planning outcome."""
    n = status.shape[0]
    total = slot_off[n]
    first = np.empty(total, np.int64)
    last = np.empty(total, np.int64)
    n_sites = np.empty(total, np.int64)
    e1 = np.empty(total, np.int64)
    e2 = np.empty(total, np.int64)
    kept = np.zeros(n, np.int64)
    outcome = np.zeros(n, np.int8)
    for i in numba.prange(n):
        if status[i] != 0:
            continue
        sites = site_at[site_off[i] : site_off[i + 1]]
        if sites.shape[0] == 0:
            continue
        cig = cigar[cigar_off[i] : cigar_off[i + 1]]
        if is_spliced(cig):
            outcome[i] = _PLAN_SPLICED
            continue
        read_len = seq_off[i + 1] - seq_off[i]
        if read_len < k:
            continue
        first_event = b2e_start[kmer_off[i] : kmer_off[i + 1]]
        f, l, s, x1, x2 = read_windows(sites, cig, ref_start[i], rc[i], read_len, k, first_event, search,
                                       min_separation, max_span, min_event_span)  # fmt: skip
        o = slot_off[i]
        m = f.shape[0]
        first[o : o + m] = f
        last[o : o + m] = l
        n_sites[o : o + m] = s
        e1[o : o + m] = x1
        e2[o : o + m] = x2
        kept[i] = m
    jobs = 0  # each read's windows moved down to follow the last read's: a job never moves up
    for i in range(n):
        for at in range(slot_off[i], slot_off[i] + kept[i]):
            first[jobs] = first[at]
            last[jobs] = last[at]
            n_sites[jobs] = n_sites[at]
            e1[jobs] = e1[at]
            e2[jobs] = e2[at]
            jobs += 1
    read = np.empty(jobs, np.int64)
    jobs = 0
    for i in range(n):
        read[jobs : jobs + kept[i]] = i
        jobs += kept[i]
    return read, first[:jobs], last[:jobs], n_sites[:jobs], e1[:jobs], e2[:jobs], kept, outcome


@dataclass
class _Jobs:
    """The (read, group) jobs of a batch: group coordinates local to the read's reference span."""

    read: np.ndarray
    first: np.ndarray
    last: np.ndarray
    n_sites: np.ndarray
    e1: np.ndarray
    e2: np.ndarray
    kept: np.ndarray  # per read: number of jobs
    spliced: np.ndarray  # per read: alignment skips reference


def _plan_jobs(batch: ReadBatch, events: EventMap, found: ReadSites, status: np.ndarray, k: int,
               groups: Grouping) -> _Jobs:  # fmt: skip
    span = np.diff(batch.ref_seq_off) + (found.ref_next != 0)  # a read's reference bases and the one after them
    n_slots = np.where(status == Skip.OK, group_slots(span, groups.min_separation), 0)
    slot_off = np.zeros(batch.n + 1, np.int64)
    np.cumsum(n_slots, out=slot_off[1:])
    read, first, last, n_sites, e1, e2, kept, outcome = _plan_windows(
        found.at, found.off, batch.ref_start, batch.rc, batch.cigar, batch.cigar_off, batch.seq_off,
        events.b2e_start, events.kmer_off, status, slot_off,
        k, groups.event_search, groups.min_separation, groups.max_span, groups.min_event_span,
    )  # fmt: skip
    return _Jobs(read, first, last, n_sites, e1, e2, kept, outcome == _PLAN_SPLICED)


def call_methylation(
    batch: ReadBatch,
    kmer_model: PoreModel,
    meth_model: PoreModel,
    events: EventMap | None = None,
    *,
    motif: Motif = CPG,
    log_var: np.ndarray | None = None,
    params: HmmParams = HmmParams(),
    groups: Grouping = Grouping(),
    scorer: Callable[[HmmJobs, HmmInputs], tuple[np.ndarray, np.ndarray]] = score_jobs,
    found: ReadSites | None = None,
) -> MethCalls:
    """Score every group of `motif` sites of every read with status 0, as nanopolish and f5c
    call-methylation do.

    `kmer_model` is the model ABEA aligned with (its k places events on the reference);
    `meth_model` (alphabet ACGMT, M the motif's modified base) scores both hypotheses, as in
    nanopolish and f5c.
    `events` are the reads' first events per k-mer and events per base (f5c's (max event - min event) /
    k-mers): the recalibration's (`PostAlign.event_map`), by default made again from the ABEA pairs.
    `log_var` (float[n]) is log of recalibration's double-precision var, which f5c uses; without it the log is taken of the float32 `batch.var` (differs by at most an ulp). A motif
    whose calls are nanopolish's (`Motif.compat`) is scored with nanopolish's arithmetic instead:
    the reads recalibrated again in double (`nanopolish_scaling`, from `batch.mom_scalings`) and the
    models in double.
    Reads left with no call get status NO_CPG (SPLICED for N in the CIGAR). `scorer` scores the
    (read, window) jobs: `score_jobs` or a function with its signature and answers (the GPU's).
    `found` is the reads' sites of `motif` where they were found ahead (`batch_sites`), else they are found now.
    """
    if kmer_model.alphabet != NUCLEOTIDE or meth_model.alphabet != METHYL_CPG or kmer_model.k != meth_model.k:
        raise ValueError("call_methylation needs a nucleotide model and a methylation (ACGMT) model of the same k")
    if batch.ev_mean.dtype != np.float32:
        raise ValueError(f"ev_mean must be float32 (f5c precision), got {batch.ev_mean.dtype}")
    k = kmer_model.k
    if events is None:
        events = event_map(batch.seq_off, batch.aln_kmer, batch.aln_event, batch.aln_off, k)
    events_per_base = events.events_per_base
    # A read without a positive event rate cannot set the HMM's stay probability.
    status = batch.status.copy()
    status[(status == Skip.OK) & ~(events_per_base > 0)] = Skip.QC_FAILED
    nanopolish = motif.compat == "nanopolish"
    if nanopolish:  # a read its recalibration fails, nanopolish does not call
        again = nanopolish_scaling(batch, kmer_model)
        status = np.where(status == Skip.OK, again.status, status).astype(np.int8)
        scalings, model = pack_scalings64(again), pack_model64(meth_model)
    else:
        scalings = pack_scalings(batch.scale, batch.shift, batch.var, log_var)
        model = pack_model(meth_model.level_mean, meth_model.level_stdv)
    sites = motif.table()
    if found is None:
        found = batch_sites(batch.ref_seq, batch.ref_seq_off, batch.ref_next, sites)
    ref = found.ref
    with timeline.span("plan jobs", reads=batch.n):
        jobs = _plan_jobs(batch, events, found, status, k, groups)
    span_len = np.diff(batch.ref_seq_off)[jobs.read]
    sep = groups.min_separation
    with timeline.span("score jobs", jobs=len(jobs.read)):
        ll_u, ll_m = scorer(
            HmmJobs(jobs.read, jobs.first - sep, np.minimum(jobs.last + sep + 1, span_len), jobs.e1, jobs.e2),
            HmmInputs(ref, batch.ref_seq_off, batch.rc, batch.ev_mean, batch.ev_off, scalings, events_per_base, k,
                      model, sites, motif.marks(), params.as_array(), LOGSUM_TABLE, nanopolish),
        )  # fmt: skip

    for i in np.flatnonzero((batch.status == Skip.OK) & (jobs.kept == 0)):
        if status[i] != Skip.OK:
            batch.fail(int(i), Skip(status[i]))
        else:
            batch.fail(int(i), Skip.SPLICED if jobs.spliced[i] else Skip.NO_CPG)

    base = batch.ref_seq_off[jobs.read]
    sequence = Texts.slices(ref, base + np.maximum(jobs.first - k + 1, 0), base + np.minimum(jobs.last + k, span_len))
    ll_m64 = ll_m.astype(np.float64)
    ll_u64 = ll_u.astype(np.float64)
    return MethCalls(
        read=jobs.read,
        start=batch.ref_start[jobs.read] + jobs.first,
        end=batch.ref_start[jobs.read] + jobs.last,
        strand=np.where(batch.rc[jobs.read], -1, 1).astype(np.int8),
        llr=ll_m64 - ll_u64,
        ll_meth=ll_m64,
        ll_unmeth=ll_u64,
        num_motifs=jobs.n_sites.astype(np.int32),
        sequence=sequence,
    )


def format_calls(calls: MethCalls, read_ids: Sequence[str], ref_names: Sequence[str]) -> str:
    """The calls as call-methylation TSV rows (no header), formatted exactly as f5c prints them.

    Written by `tsv.format_rows` (the same bytes, in parallel, without the GIL); values beyond
    its exact range, which no log-likelihood reaches, are formatted by Python.
    """
    if not printf.fits(calls.llr, calls.ll_meth, calls.ll_unmeth):
        return _format_calls_python(calls, read_ids, ref_names)
    refs, ref_off = printf.blob(ref_names)
    ids, id_off = printf.blob(read_ids)
    text = tsv.format_rows(
        calls.read, calls.start, calls.end, calls.strand, calls.llr, calls.ll_meth, calls.ll_unmeth, calls.num_motifs,
        refs, ref_off, ids, id_off, calls.sequence.blob, calls.sequence.off,
    )  # fmt: skip
    return printf.text(text)


def _format_calls_python(calls: MethCalls, read_ids: Sequence[str], ref_names: Sequence[str]) -> str:
    rows = []
    for j in range(len(calls)):
        r = int(calls.read[j])
        rows.append(
            f"{ref_names[r]}\t{'-' if calls.strand[j] < 0 else '+'}\t{calls.start[j]}\t{calls.end[j]}\t"
            f"{read_ids[r]}\t{calls.llr[j]:.2f}\t{calls.ll_meth[j]:.2f}\t{calls.ll_unmeth[j]:.2f}\t"
            f"1\t{calls.num_motifs[j]}\t{calls.sequence[j]}\n"
        )
    return "".join(rows)
