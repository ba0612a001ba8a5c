"""Eventalign rows as the tools print them: the TSV (a numba row writer), the per-read summary, the
event-space SAM (nanopolish's, f5c's version 1) and f5c 1.6's signal-alignment tags (its SAM version 2).

The row writer (`write_rows`, `_tsv_row`) takes one flat array per column, as numba needs;
`format_tsv` takes the rows record and unpacks it once."""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np
from numba import prange

from streamer.pipeline.batch import CIGAR_D, CIGAR_I, CIGAR_M, CIGAR_S, ReadBatch
from streamer_plugins import printf
from streamer_plugins.printf import FLOAT32_BITS, put_byte, put_bytes, put_fixed, put_int
from streamer_plugins.eventalign.viterbi import _ACGT
from streamer_plugins.eventalign.rows import (
    EventalignOptions,
    EventalignRows,
)


TSV_COLUMNS = ("contig", "position", "reference_kmer", "read_index", "strand", "event_index", "event_level_mean",
               "event_stdv", "event_length", "model_kmer", "model_mean", "model_stdv", "standardized_level")  # fmt: skip


def tsv_header(options: EventalignOptions) -> str:
    cols = list(TSV_COLUMNS)
    if options.print_read_names:
        cols[3] = "read_name"
    if options.signal_index:
        cols += ["start_idx", "end_idx"]
    if options.samples:
        cols.append("samples")
    return "\t".join(cols) + "\n"


def scaled_samples(signal: np.ndarray, shift: float, scale: float) -> str:
    """Samples of one event scaled to the model, as the tools print them (C++ stream, 6 digits)."""
    s = ((signal.astype(np.float64) - np.float64(shift)) / np.float64(scale)).astype(np.float32)
    return ",".join("%g" % v for v in s.tolist())


@numba.njit(nogil=True, cache=True)
def _put_kmer(buf, pos, rank, k, write):
    """The nucleotide k-mer of `rank`, or k N's for -1."""
    for j in range(k - 1, -1, -1):
        c = 78 if rank < 0 else _ACGT[(rank >> (2 * j)) & 3]
        pos = put_byte(buf, pos, c, write)
    return pos


@numba.njit(nogil=True, cache=True)
def _tab_float(buf, pos, x, decimals, write):
    """A tab, then float32 x to `decimals` places: most of the row's columns."""
    return put_fixed(buf, put_byte(buf, pos, 9, write), x, decimals, FLOAT32_BITS, write)


@numba.njit(nogil=True, cache=True)
def _tsv_row(buf, pos, j, read, position, ref, kmer_at, k, event, mean, stdv, length, rank, mmean, mstdv, z, start,
             end, contig, contig_off, label, label_off, signal_index, write):  # fmt: skip
    r = read[j]
    tab = 9
    pos = put_bytes(buf, pos, contig, contig_off[r], contig_off[r + 1], write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_int(buf, pos, position[j], write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_bytes(buf, pos, ref, kmer_at[j], kmer_at[j] + k, write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_bytes(buf, pos, label, label_off[r], label_off[r + 1], write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_byte(buf, pos, 116, write)  # strand: template
    pos = put_byte(buf, pos, tab, write)
    pos = put_int(buf, pos, event[j], write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_fixed(buf, pos, mean[j], 2, FLOAT32_BITS, write)
    pos = _tab_float(buf, pos, stdv[j], 3, write)
    pos = _tab_float(buf, pos, length[j], 5, write)
    pos = put_byte(buf, pos, tab, write)
    pos = _put_kmer(buf, pos, rank[j], k, write)
    pos = _tab_float(buf, pos, mmean[j], 2, write)
    pos = _tab_float(buf, pos, mstdv[j], 2, write)
    pos = _tab_float(buf, pos, z[j], 2, write)
    if signal_index:
        pos = put_byte(buf, pos, tab, write)
        pos = put_int(buf, pos, start[j], write)
        pos = put_byte(buf, pos, tab, write)
        pos = put_int(buf, pos, end[j], write)
    return put_byte(buf, pos, 10, write)


@numba.njit(nogil=True, cache=True, parallel=True)
def write_rows(read, position, ref, kmer_at, k, event, mean, stdv, length, rank, mmean, mstdv, z, start, end, contig,
               contig_off, label, label_off, signal_index):  # fmt: skip
    """uint8 text of every row: each row measured, then all written in parallel into one buffer."""
    n = read.shape[0]
    dummy = np.empty(0, np.uint8)
    row_off = np.zeros(n + 1, np.int64)
    for j in prange(n):
        row_off[j + 1] = _tsv_row(dummy, 0, j, read, position, ref, kmer_at, k, event, mean, stdv, length, rank,
                                  mmean, mstdv, z, start, end, contig, contig_off, label, label_off, signal_index,
                                  False)  # fmt: skip
    for j in range(n):
        row_off[j + 1] += row_off[j]
    buf = np.empty(row_off[n], np.uint8)
    for j in prange(n):
        _tsv_row(buf, row_off[j], j, read, position, ref, kmer_at, k, event, mean, stdv, length, rank, mmean, mstdv,
                 z, start, end, contig, contig_off, label, label_off, signal_index, True)  # fmt: skip
    return buf


def format_tsv(rows: EventalignRows, batch: ReadBatch, read_labels: Sequence[str], options: EventalignOptions) -> str:
    """The rows as eventalign TSV text (no header), byte for byte what the tools' printf gives.

    Rows are written by `write_rows` (values beyond its exact range, which no event reaches,
    by Python); `--samples` columns are appended by Python.
    """
    if not len(rows):
        return ""
    values = (rows.event_level_mean, rows.event_stdv, rows.event_length, rows.model_mean, rows.model_stdv,
              rows.standardized_level)  # fmt: skip
    if printf.fits(*values, limit=printf.FLOAT32_LIMIT):
        contig, contig_off = printf.blob(batch.ref_names)
        label, label_off = printf.blob(read_labels)
        text = printf.text(write_rows(rows.read, rows.position, rows.ref, rows.kmer_at, rows.k, rows.event_index,
                                      *values[:3], rows.model_rank, *values[3:], rows.start_idx, rows.end_idx, contig,
                                      contig_off, label, label_off, options.signal_index))  # fmt: skip
        lines = text.split("\n")[:-1]
    else:
        lines = _format_python(rows, batch, read_labels, options)
    if options.samples:
        sig_off = batch.signal_off
        for j, (r, a, b) in enumerate(zip(rows.read.tolist(), rows.start_idx.tolist(), rows.end_idx.tolist())):
            shift, scale = rows.sample_scaling[r]
            lines[j] += "\t" + scaled_samples(batch.signal[sig_off[r] + a : sig_off[r] + b], shift, scale)
    return "\n".join(lines) + "\n"


def _format_python(rows: EventalignRows, batch: ReadBatch, read_labels: Sequence[str],
                   options: EventalignOptions) -> list[str]:  # fmt: skip
    contig = np.asarray(batch.ref_names, dtype=object)[rows.read].tolist()
    label = np.asarray(read_labels, dtype=object)[rows.read].tolist()
    cols = [contig, rows.position.tolist(), rows.reference_kmer, label, rows.event_index.tolist(),
            rows.event_level_mean.tolist(), rows.event_stdv.tolist(), rows.event_length.tolist(), rows.model_kmer,
            rows.model_mean.tolist(), rows.model_stdv.tolist(), rows.standardized_level.tolist()]  # fmt: skip
    fmt = "%s\t%d\t%s\t%s\tt\t%d\t%.2f\t%.3f\t%.5f\t%s\t%.2f\t%.2f\t%.2f"
    if options.signal_index:
        cols += [rows.start_idx.tolist(), rows.end_idx.tolist()]
        fmt += "\t%d\t%d"
    return [fmt % t for t in zip(*cols)]


SUMMARY_HEADER = ("read_index\tread_name\tfast5_path\tmodel_name\tstrand\tnum_events\tnum_steps\tnum_skips\t"
                  "num_stays\ttotal_duration\tshift\tscale\tdrift\tvar\n")  # fmt: skip


def summary_lines(rows: EventalignRows, batch: ReadBatch, read_index: Sequence[int], paths: Sequence[str]) -> str:
    """`--summary` lines of the reads with rows: moves along the reference and the time aligned.

    A move of 0 is a stay, of 1 a step, anything else a skip (the tools compare unsigned, so a
    move backwards is a skip too); the first row is neither.
    """
    out = []
    for i in range(batch.n):
        a, b = rows.row_off[i], rows.row_off[i + 1]
        if a == b:
            continue
        move = np.diff(rows.position[a:b])
        stays = int(np.count_nonzero(move == 0))
        steps = int(np.count_nonzero(move == 1))
        skips = len(move) - stays - steps
        g = batch.ev_off[i] + rows.event_index[a:b]
        samples = float(np.cumsum(batch.ev_length[g].astype(np.float64))[-1])
        duration = samples / float(np.float32(batch.sample_rate[i]))
        out.append(
            f"{read_index[i]}\t{batch.read_ids[i]}\t{paths[i]}\t{rows.molecule}\ttemplate\t{b - a}\t{steps}\t{skips}\t"
            f"{stays}\t"
            f"{duration:.2f}\t{float(batch.shift[i]):.3f}\t{float(batch.scale[i]):.3f}\t0.000\t{float(batch.var[i]):.3f}\n"
        )
    return "".join(out)


def event_cigar(position: np.ndarray, event: np.ndarray) -> list[tuple[int, int]]:
    """One read's rows as an event-space CIGAR (nanopolish's `--sam`): events are the query.

    Events before the first aligned one are soft-clipped; a step of one base and one event is a
    match, a jump over bases a deletion before the match, another event on the same base an
    insertion.
    """
    ops: list[list[int]] = []
    if event[0] > 0:
        ops.append([CIGAR_S, int(event[0])])
    ops.append([CIGAR_M, 1])
    r_step = np.abs(np.diff(position)).tolist()
    e_step = np.abs(np.diff(event)).tolist()
    for dr, de in zip(r_step, e_step):
        if dr == 1 and de == 1:
            op = CIGAR_M
        elif dr > 1:
            ops.append([CIGAR_D, dr - 1])
            op = CIGAR_M
        else:
            op = CIGAR_I
        if ops[-1][0] == op:
            ops[-1][1] += 1
        else:
            ops.append([op, 1])
    return [(op, n) for op, n in ops]


def sam_records(rows: EventalignRows, batch: ReadBatch, mapq: Sequence[int], header) -> list:
    """`--sam`: one unmapped-sequence record per read, `<name>.template`, its events aligned to the reference.

    `header` is the input BAM's (pysam `AlignmentHeader`); ES:i is +1 when events run with the
    reference, -1 when against it.
    """
    import pysam

    out = []
    for i in range(batch.n):
        a, b = rows.row_off[i], rows.row_off[i + 1]
        if a == b:
            continue
        pos, ev = rows.position[a:b], rows.event_index[a:b]
        rec = pysam.AlignedSegment(header)
        rec.query_name = f"{batch.read_ids[i]}.template"
        rec.reference_name = batch.ref_names[i]
        rec.reference_start = int(pos[0])
        rec.mapping_quality = int(mapq[i])
        rec.flag = 16 if batch.rc[i] else 0
        rec.cigartuples = event_cigar(pos, ev)
        rec.next_reference_id = -1
        rec.next_reference_start = -1
        rec.template_length = 0
        rec.set_tag("ES", 1 if ev[0] < ev[-1] else -1, "i")
        out.append(rec)
    return out


def f5c_ss_tags(position: np.ndarray, start: np.ndarray, end: np.ndarray, rc: bool, rna: bool) -> tuple[str, str]:
    """One read's rows as f5c 1.6's `si` and `ss` tags (`eventalign --sam`, version 2): the signal span and
    the reference k-mer span, and the signal's path along the reference (`N,` samples on a k-mer, `ND`
    k-mers passed over, `NI` samples on none), both in signal order.

    `position` is each row's reference k-mer, `start`/`end` its event's samples; rows on one k-mer are
    taken together. The rows run with the signal on DNA's forward strand and RNA's reverse one (RNA's
    events were turned 5'->3'), against it otherwise; for RNA the k-mer span is written end first.
    """
    if rc != rna:  # the rows run against the signal
        position, start, end = position[::-1], start[::-1], end[::-1]
    ascending = rc == rna  # along the reference as the signal goes
    first, last = int(position[0]), int(position[-1])
    lo, hi = (first, last + 1) if ascending else (last, first + 1)
    si = f"{int(start[0])},{int(end[-1])},{hi if rna else lo},{lo if rna else hi}"
    parts = []
    ref_at, sample_at = first, int(start[0])
    n, i = len(position), 0
    while i < n:
        j = i + 1
        while j < n and position[j] == position[i]:
            j += 1
        a, b = int(min(start[i], start[j - 1])), int(max(end[i], end[j - 1]))
        if gap := abs(int(position[i]) - ref_at):
            parts.append(f"{gap}D")
        if a > sample_at:
            parts.append(f"{a - sample_at}I")
        if b > a:
            parts.append(f"{b - a},")
        sample_at = b
        ref_at = int(position[i]) + (1 if ascending else -1)
        i = j
    return si, "".join(parts)
