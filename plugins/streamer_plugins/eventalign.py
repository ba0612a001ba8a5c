"""Event-to-reference alignment (`streamer eventalign`), as nanopolish 0.14 and f5c 1.1 compute it.

ABEA aligns events to the read's own k-mers; eventalign carries them onto the reference. As
the tools do, the read's CIGAR is walked in pieces of about 100 reference bases: the closest
events to a piece's ends (through the base-to-event map) bound it, a profile HMM (the
methylation HMM's states M, B and K, with the nucleotide model) is decoded by Viterbi, and
about 50 aligned events are kept before the next piece starts from the last one kept. The
Viterbi cells, emissions and transitions are float32 with the tools' order of operations and
tie-breaking (a tie goes to the later move), so the same events land on the same k-mers.

Paths through repeats (a homopolymer, CACCACCAC...) tie in exact arithmetic: their terms are
the same, summed in another order, so the last bit of every emission decides. By default the
arithmetic is f5c 1.1's (float32 model and scalings, log var from recalibration's double var).
`NanopolishScaling` gives nanopolish 0.14's instead: its built-in model (the model file to 5
decimals), recalibrated scalings kept in double, Gaussians scaled in double then rounded,
log(1/sqrt(2 pi)) to float precision, and at least 1.25 events per base in the transitions.

Rows come back as columns (`EventalignRows.columns`, what the daemon's `eventalign` topic
carries) and as the tools' TSV text (`format_tsv`), plus the per-read `--summary` lines.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np
from numba import prange

from streamer.abea import align_batch
from streamer.batch import CIGAR_D, CIGAR_I, CIGAR_M, CIGAR_N, CIGAR_S, ReadBatch
from streamer.events import detect_events
from streamer.pipeline import Pipeline, PipelineOptions
from streamer_plugins.cpg import tsv
from streamer_plugins.cpg.hmm import (
    S_LOG_VAR,
    S_SCALE,
    S_SHIFT,
    S_VAR,
    STATE_B,
    STATE_K,
    STATE_M,
    T_BB,
    T_BK,
    T_BM_NEXT,
    T_BM_SELF,
    T_KK,
    T_KM,
    T_MB,
    T_MK,
    T_MM_NEXT,
    T_MM_SELF,
    HmmParams,
    block_transitions,
    pack_model,
    pack_scalings,
    scaled_level,
)
from streamer_plugins.cpg.lookup import CLOSEST_EVENT_SEARCH, aligned_segments, closest_event
from streamer_plugins.cpg.sites import DISAMBIGUATE
from streamer_plugins.cpg.tsv import _put_byte, _put_bytes, _put_int, _put_uint
from streamer.poremodel import NUCLEOTIDE, PoreModel
from streamer.postalign import recalibrate_batch
from streamer.scaling import estimate_scalings
from streamer.skips import Skip, Skipped

ALIGN_STRIDE = 100  # reference bases per HMM piece, about
OUTPUT_STRIDE = 50  # aligned events kept per piece, about (all of the last piece)

# Viterbi moves, in the order whose ties the tools break towards the later one.
FROM_SAME_M, FROM_PREV_M, FROM_SAME_B, FROM_PREV_B, FROM_PREV_K, FROM_SOFT = range(6)

STATE_CHAR_M = 77  # 'M'
STATE_CHAR_B = 66  # 'B'

F5C_LOG_INV_SQRT_2PI = np.float32(-0.918938)  # f5c's literal
NANOPOLISH_LOG_INV_SQRT_2PI = np.float32(math.log(0.3989422804014327))  # nanopolish's, to float
NANOPOLISH_MIN_EVENTS_PER_BASE = 1.25

_ACGT = np.frombuffer(b"ACGT", np.uint8)
_BASE_RANK = np.zeros(256, np.int64)  # ACGT -> 0..3; anything else 0, as the tools rank it
for _i, _b in enumerate(b"ACGT"):
    _BASE_RANK[_b] = _i


@numba.njit(nogil=True, cache=True, inline="always")
def _take(best, move, x, i):
    """One step of the tools' max loop: a later score equal to the best takes the move."""
    if x > best:
        best = x
    if best == x:
        move = i
    return best, move


@numba.njit(nogil=True, cache=True)
def _best(x0, x1, x2, x3, x4, x5):
    """(max, move) over the six moves, ties going to the later move as in the tools' loop."""
    best, move = _take(x0, 0, x1, 1)
    best, move = _take(best, move, x2, 2)
    best, move = _take(best, move, x3, 3)
    best, move = _take(best, move, x4, 4)
    return _take(best, move, x5, 5)


@numba.njit(nogil=True, cache=True)
def _kmer_rank(ref, start, k, rc, base_rank):
    """Nucleotide rank of ref[start:start+k], or of its reverse complement."""
    r = 0
    for j in range(k):
        if rc:
            r = r * 4 + 3 - base_rank[ref[start + k - 1 - j]]
        else:
            r = r * 4 + base_rank[ref[start + j]]
    return r


@numba.njit(nogil=True, cache=True)
def _kmer_level(rank, model, scalings, model64, scalings64):
    """(mean, stdv, log stdv) of k-mer `rank` scaled to the read, float32.

    f5c scales in float32 (`scaled_level`); with a double model (`model64` non-empty) the
    scaling is nanopolish's: in double, rounded once.
    """
    if model64.shape[1] == 0:
        return scaled_level(rank, model, scalings[S_SCALE], scalings[S_SHIFT], scalings[S_VAR], scalings[S_LOG_VAR])
    mean = np.float32(scalings64[S_SCALE] * model64[0, rank] + scalings64[S_SHIFT])
    stdv = np.float32(model64[1, rank] * scalings64[S_VAR])
    log_stdv = np.float32(model64[2, rank] + scalings64[S_LOG_VAR])
    return mean, stdv, log_stdv


@numba.njit(nogil=True, cache=True)
def viterbi_piece(ref, s0, length, rc, ev_mean, e_start, e_stop, k, model, scalings, model64, scalings64, log_c,
                  trans, lp_soft, base_rank, out_event, out_kmer, out_state):  # fmt: skip
    """Decode events e_start..e_stop (either direction) against k-mers of ref[s0:s0+length].

    Writes the path in event order (event, k-mer index in the piece, state K/B/M) and returns
    its length. The path always ends in M of the last k-mer at the last event and stops at the
    first k-mer's entry from the start state, as the tools' backtrack does. `log_c` is the
    tool's log(1/sqrt(2 pi)).
    """
    ninf = np.float32(-np.inf)
    n_kmers = length - k + 1
    stride = 1 if e_start <= e_stop else -1
    n_rows = abs(e_stop - e_start) + 2
    n_cols = 3 * (n_kmers + 2)
    mean = np.empty(n_kmers, np.float32)
    stdv = np.empty(n_kmers, np.float32)
    log_stdv = np.empty(n_kmers, np.float32)
    for ki in range(n_kmers):
        rank = _kmer_rank(ref, s0 + ki, k, rc, base_rank)
        mean[ki], stdv[ki], log_stdv[ki] = _kmer_level(rank, model, scalings, model64, scalings64)
    vm = np.full((n_rows, n_cols), ninf, np.float32)
    bm = np.zeros((n_rows, n_cols), np.uint8)
    for row in range(1, n_rows):
        level = ev_mean[e_start + (row - 1) * stride]
        up = vm[row - 1]
        cur = vm[row]
        moves = bm[row]
        for block in range(1, n_kmers + 1):
            ki = block - 1
            c = 3 * block
            p = c - 3
            soft = lp_soft if (ki == 0 and row == 1) else ninf
            m, move = _best(
                trans[T_MM_SELF] + up[c + STATE_M],
                trans[T_MM_NEXT] + up[p + STATE_M],
                trans[T_BM_SELF] + up[c + STATE_B],
                trans[T_BM_NEXT] + up[p + STATE_B],
                trans[T_KM] + up[p + STATE_K],
                soft,
            )
            a = (level - mean[ki]) / stdv[ki]
            cur[c + STATE_M] = m + (log_c - log_stdv[ki] + np.float32(-0.5) * a * a)  # log N(level; mean, stdv)
            moves[c + STATE_M] = move
            b, move = _best(trans[T_MB] + up[c + STATE_M], ninf, trans[T_BB] + up[c + STATE_B], ninf, ninf, ninf)
            cur[c + STATE_B] = b  # a bad event emits with log-probability 0
            moves[c + STATE_B] = move
            s, move = _best(ninf, trans[T_MK] + cur[p + STATE_M], ninf, trans[T_BK] + cur[p + STATE_B],
                            trans[T_KK] + cur[p + STATE_K], ninf)  # fmt: skip
            cur[c + STATE_K] = s
            moves[c + STATE_K] = move
    # backtrack from M of the last k-mer at the last event
    row = n_rows - 1
    col = 3 * n_kmers + STATE_M
    n = 0
    while row > 0:
        kmer = col // 3 - 1
        state = col % 3
        out_event[n] = e_start + (row - 1) * stride
        out_kmer[n] = kmer
        out_state[n] = state
        n += 1
        move = bm[row, col]
        if move == FROM_SOFT:
            break
        if move == FROM_SAME_M or move == FROM_PREV_M:
            nxt = STATE_M
        elif move == FROM_SAME_B or move == FROM_PREV_B:
            nxt = STATE_B
        else:
            nxt = STATE_K
        if move == FROM_PREV_M or move == FROM_PREV_B or move == FROM_PREV_K:
            kmer -= 1
        if state != STATE_K:
            row -= 1
        col = 3 * (kmer + 1) + nxt
    out_event[:n] = out_event[:n][::-1].copy()
    out_kmer[:n] = out_kmer[:n][::-1].copy()
    out_state[:n] = out_state[:n][::-1].copy()
    return n


@numba.njit(nogil=True, cache=True)
def _end_pair(ref_pos, p0, p1, ref_max, idx):
    """Last pair at or after idx (within p0..p1) whose reference position is at most ref_max."""
    while idx < p1:
        if ref_pos[idx] > ref_max:
            return idx - 1
        idx += 1
    return p1 - 1


@numba.njit(nogil=True, cache=True)
def realign_read(ref, ref_start, cigar, rc, read_len, k, first_event, ev_mean, model, scalings, model64, scalings64,
                 log_c, trans, lp_soft, base_rank, search, out_ref, out_event, out_state, out_rank):  # fmt: skip
    """Eventalign of one read into the out_* arrays; returns the number of rows.

    `ref` is the disambiguated reference of the aligned span, `first_event` the first event of
    each read k-mer (-1 if none). Rows are in reference order: absolute position, event index,
    state ('M' or 'B') and the model k-mer's rank (-1 for B).
    """
    cap = out_ref.shape[0]
    n_out = 0
    ref_pos, read_pos, seg_off = aligned_segments(cigar, ref_start)
    max_events = ev_mean.shape[0] + 1
    path_event = np.empty(max_events + ref.shape[0], np.int64)
    path_kmer = np.empty(max_events + ref.shape[0], np.int64)
    path_state = np.empty(max_events + ref.shape[0], np.int64)
    for seg in range(seg_off.shape[0] - 1):
        p0 = seg_off[seg]
        p1 = seg_off[seg + 1]
        while p1 > p0 and read_pos[p1 - 1] > read_len - k:  # the last k-mer must fit in the read
            p1 -= 1
        if p1 == p0:
            return n_out
        k_start = read_pos[p0]
        k_end = read_pos[p1 - 1]
        if rc:
            k_start = read_len - k_start - k
            k_end = read_len - k_end - k
        first = closest_event(first_event, k_start, search)
        last = closest_event(first_event, k_end, search)
        forward = first < last
        cur_event = first
        cur_ref = ref_pos[p0]
        cur_pair = p0
        while (forward and cur_event < last) or (not forward and cur_event > last):
            end_pair = _end_pair(ref_pos, p0, p1, cur_ref + ALIGN_STRIDE, cur_pair)
            end_ref = ref_pos[end_pair]
            end_read = read_pos[end_pair]
            if rc:
                end_read = read_len - end_read - k
            s = cur_ref - ref_start
            length = end_ref - cur_ref + 1
            if length < 2 * k:
                break
            stop = closest_event(first_event, end_read, search)
            if cur_event < 0 or stop < 0 or abs(cur_event - stop) < 2:
                break
            n_path = viterbi_piece(ref, s, length, rc, ev_mean, cur_event, stop, k, model, scalings, model64,
                                   scalings64, log_c, trans, lp_soft, base_rank, path_event, path_kmer,
                                   path_state)  # fmt: skip
            last_piece = end_pair == p1 - 1
            n_kept = 0
            kept_event = 0
            kept_ref = 0
            for a in range(n_path):
                if n_kept >= OUTPUT_STRIDE and not last_piece:
                    break
                if path_state[a] == STATE_K or path_event[a] == cur_event:
                    continue
                if n_out == cap:
                    return n_out
                pos = cur_ref + path_kmer[a]
                out_ref[n_out] = pos
                out_event[n_out] = path_event[a]
                if path_state[a] == STATE_B:
                    out_state[n_out] = STATE_CHAR_B
                    out_rank[n_out] = -1
                else:
                    out_state[n_out] = STATE_CHAR_M
                    out_rank[n_out] = _kmer_rank(ref, pos - ref_start, k, rc, base_rank)
                n_out += 1
                kept_event = path_event[a]
                kept_ref = pos
                n_kept += 1
            cur_event = kept_event
            cur_ref = kept_ref
            cur_pair = _end_pair(ref_pos, p0, p1, cur_ref, cur_pair)
            if n_kept == 0:
                break
    return n_out


@numba.njit(nogil=True, cache=True)
def _n_segments(cigar):
    n = 1
    for i in range(cigar.shape[0]):
        if cigar[i, 0] == CIGAR_N:
            n += 1
    return n


@numba.njit(parallel=True, nogil=True, cache=True)
def realign_batch(ref_seq, ref_seq_off, ref_start, cigar, cigar_off, rc, seq_off, ev_mean, ev_off, status,
                  b2e_start, kmer_off, events_per_base, k, model, scalings, model64, scalings64, log_c, params, lp_soft,
                  base_rank, search):  # fmt: skip
    """Eventalign of every read with status 0, in parallel; rows in flat arrays with offsets.

    `model64` (float64[3, n_kmers]: mean, stdv, log stdv) and `scalings64` (float64[n, 4], as
    `pack_scalings` lays them out) scale the model in double; a `model64` with no columns keeps
    f5c's float32 (`model`, `scalings`).
    """
    n = seq_off.shape[0] - 1
    cap_off = np.zeros(n + 1, np.int64)
    for i in range(n):
        cap = 0
        if status[i] == 0:
            cap = (ev_off[i + 1] - ev_off[i]) * _n_segments(cigar[cigar_off[i] : cigar_off[i + 1]])
        cap_off[i + 1] = cap_off[i] + cap
    out_ref = np.empty(cap_off[n], np.int64)
    out_event = np.empty(cap_off[n], np.int64)
    out_state = np.empty(cap_off[n], np.uint8)
    out_rank = np.empty(cap_off[n], np.int64)
    count = np.zeros(n, np.int64)
    for i in prange(n):
        if status[i] != 0 or cap_off[i + 1] == cap_off[i]:
            continue
        a = cap_off[i]
        b = cap_off[i + 1]
        count[i] = realign_read(
            ref_seq[ref_seq_off[i] : ref_seq_off[i + 1]], ref_start[i], cigar[cigar_off[i] : cigar_off[i + 1]],
            rc[i], seq_off[i + 1] - seq_off[i], k, b2e_start[kmer_off[i] : kmer_off[i + 1]],
            ev_mean[ev_off[i] : ev_off[i + 1]], model, scalings[i], model64, scalings64[i],
            log_c, block_transitions(events_per_base[i], params), lp_soft, base_rank, search, out_ref[a:b],
            out_event[a:b], out_state[a:b], out_rank[a:b],
        )  # fmt: skip
    row_off = np.zeros(n + 1, np.int64)
    for i in range(n):
        row_off[i + 1] = row_off[i] + count[i]
    ref_pos = np.empty(row_off[n], np.int64)
    event = np.empty(row_off[n], np.int64)
    state = np.empty(row_off[n], np.uint8)
    rank = np.empty(row_off[n], np.int64)
    for i in prange(n):
        a = cap_off[i]
        o = row_off[i]
        for j in range(count[i]):
            ref_pos[o + j] = out_ref[a + j]
            event[o + j] = out_event[a + j]
            state[o + j] = out_state[a + j]
            rank[o + j] = out_rank[a + j]
    return row_off, ref_pos, event, state, rank


@dataclass(frozen=True)
class EventalignOptions:
    """What the rows carry: read names or indices, events scaled to the model, signal spans, samples."""

    print_read_names: bool = False
    scale_events: bool = False
    signal_index: bool = False
    samples: bool = False


@dataclass
class EventalignRows:
    """Eventalign rows of one batch as arrays; `row_off` gives each read's rows."""

    row_off: np.ndarray  # int64[n_reads + 1]
    read: np.ndarray  # int64: the read (batch index) of each row
    position: np.ndarray  # int64: reference position of the k-mer
    ref: np.ndarray  # uint8: the batch's disambiguated reference spans
    kmer_at: np.ndarray  # int64: where each row's reference k-mer starts in `ref`
    k: int
    event_index: np.ndarray  # int64, within the read
    event_level_mean: np.ndarray  # float32
    event_stdv: np.ndarray  # float32
    event_length: np.ndarray  # float32 seconds
    model_rank: np.ndarray  # int64: nucleotide rank of the model k-mer, -1 for a bad event (NNNNNN)
    model_mean: np.ndarray  # float32 (0 for a bad event)
    model_stdv: np.ndarray  # float32
    standardized_level: np.ndarray  # float32
    start_idx: np.ndarray  # int64: the event's first sample
    end_idx: np.ndarray  # int64: past its last sample
    state: np.ndarray  # uint8: 'M' or 'B'
    sample_scaling: np.ndarray  # float64[n_reads, 2]: shift and scale that put `--samples` on the model

    def __len__(self) -> int:
        return len(self.position)

    @property
    def reference_kmer(self) -> list[str]:
        text = self.ref.tobytes().decode("ascii")
        return [text[a : a + self.k] for a in self.kmer_at.tolist()]

    @property
    def model_kmer(self) -> list[str]:
        return _kmer_names(self.model_rank, self.k)

    def columns(self, read_labels: Sequence[str], contigs: Sequence[str]) -> dict[str, object]:
        """The TSV's columns by name (numeric as arrays, text as lists); labels and contigs per read."""
        labels = np.asarray(read_labels, dtype=object)[self.read].tolist() if len(self) else []
        contig = np.asarray(contigs, dtype=object)[self.read].tolist() if len(self) else []
        return {
            "contig": contig,
            "position": self.position,
            "reference_kmer": self.reference_kmer,
            "read": labels,
            "strand": ["t"] * len(self),
            "event_index": self.event_index,
            "event_level_mean": self.event_level_mean,
            "event_stdv": self.event_stdv,
            "event_length": self.event_length,
            "model_kmer": self.model_kmer,
            "model_mean": self.model_mean,
            "model_stdv": self.model_stdv,
            "standardized_level": self.standardized_level,
            "start_idx": self.start_idx,
            "end_idx": self.end_idx,
        }


def _kmer_names(rank: np.ndarray, k: int) -> list[str]:
    """The nucleotide k-mer of each rank, NNN..N for -1 (a bad event's model k-mer); decoded per row,
    as the table of all 4^k names is large for 9-mers."""
    digits = (rank[:, None] >> (2 * np.arange(k - 1, -1, -1))) & 3
    letters = np.where(rank[:, None] < 0, ord("N"), _ACGT[digits]).astype(np.uint8)
    return np.ascontiguousarray(letters).view(f"S{k}").ravel().astype(f"U{k}").tolist()


@dataclass(frozen=True)
class NanopolishScaling:
    """nanopolish 0.14's model and per-read scalings, all double (see the module docstring).

    `from_recalibration` builds it from the post-alignment stage run with `nanopolish_model`.
    """

    level_mean: np.ndarray  # float64[n_kmers]
    level_stdv: np.ndarray  # float64[n_kmers]
    shift: np.ndarray  # float64[n_reads]
    scale: np.ndarray  # float64[n_reads]
    var: np.ndarray  # float64[n_reads]

    @classmethod
    def from_recalibration(cls, model: PoreModel, exact: np.ndarray) -> NanopolishScaling:
        return cls(model.level_mean, model.level_stdv, exact[:, 0], exact[:, 1], exact[:, 2])


def nanopolish_model(model: PoreModel) -> PoreModel:
    """The nucleotide model as nanopolish's built-in tables hold it: values to 5 decimals, in double."""
    mean = np.round(model.level_mean.astype(np.float64), 5)
    stdv = np.round(model.level_stdv.astype(np.float64), 5)
    return PoreModel(model.name, model.k, model.alphabet, mean, stdv, np.log(stdv))


def eventalign_batch(batch: ReadBatch, model: PoreModel, b2e_start: np.ndarray, kmer_off: np.ndarray,
                     events_per_base: np.ndarray, scale_events: bool = False, log_var: np.ndarray | None = None,
                     nanopolish: NanopolishScaling | None = None) -> EventalignRows:  # fmt: skip
    """Eventalign rows of every read of a batch that passed the stages (status 0).

    `b2e_start`, `kmer_off` and `events_per_base` are the post-alignment stage's outputs;
    `log_var` is log of its double var (f5c's; taken from the float32 var when absent). Values
    are float32 computed in the tools' order, so that printing them gives the tools' text;
    f5c's arithmetic unless `nanopolish` is given.
    """
    if model.alphabet != NUCLEOTIDE:
        raise ValueError("eventalign needs a nucleotide pore model")
    k = model.k
    ref = DISAMBIGUATE[batch.ref_seq]
    status = batch.status.copy()
    epb = np.asarray(events_per_base, np.float64)
    status[(status == Skip.OK) & ~(epb > 0)] = Skip.QC_FAILED
    scalings = pack_scalings(batch.scale, batch.shift, batch.var, log_var)
    if nanopolish is None:
        model64, scalings64, log_c = np.empty((3, 0)), np.zeros((batch.n, 4)), F5C_LOG_INV_SQRT_2PI
    else:
        np_stdv = nanopolish.level_stdv
        model64 = np.stack([nanopolish.level_mean, np_stdv, np.log(np_stdv)])
        with np.errstate(divide="ignore", invalid="ignore"):
            scalings64 = np.stack([nanopolish.scale, nanopolish.shift, nanopolish.var, np.log(nanopolish.var)], axis=1)
        log_c = NANOPOLISH_LOG_INV_SQRT_2PI
        epb = np.maximum(epb, NANOPOLISH_MIN_EVENTS_PER_BASE)
    lp_soft = np.float32(math.log(1.0 - HmmParams.start_to_clip))
    row_off, position, event, state, rank = realign_batch(
        ref, batch.ref_seq_off, batch.ref_start, batch.cigar, batch.cigar_off, batch.rc, batch.seq_off, batch.ev_mean,
        batch.ev_off, status, b2e_start, kmer_off, epb, k, pack_model(model.level_mean, model.level_stdv), scalings,
        model64, scalings64, log_c, HmmParams().as_array(), lp_soft, _BASE_RANK, CLOSEST_EVENT_SEARCH,
    )  # fmt: skip
    read = np.repeat(np.arange(batch.n, dtype=np.int64), np.diff(row_off))
    g = batch.ev_off[read] + event
    mean = batch.ev_mean[g]
    bad = state == STATE_CHAR_B
    r = np.maximum(rank, 0)
    if nanopolish is None:
        shift = batch.shift[read].astype(np.float32)
        scale = batch.scale[read].astype(np.float32)
        var = batch.var[read].astype(np.float32)
        mu = model.level_mean[r].astype(np.float32)
        sd = model.level_stdv[r].astype(np.float32)
        if scale_events:
            mean = (mean - shift) / scale
        else:
            mu = scale * mu + shift
            sd = sd * var
        sample_scaling = np.stack([batch.shift, batch.scale], axis=1).astype(np.float32).astype(np.float64)
    else:
        shift, scale, var = nanopolish.shift[read], nanopolish.scale[read], nanopolish.var[read]
        mu, sd = nanopolish.level_mean[r], nanopolish.level_stdv[r]
        if scale_events:
            mean = ((mean - shift) / scale).astype(np.float32)
        else:
            mu = scale * mu + shift
            sd = sd * var
        mu, sd = mu.astype(np.float32), sd.astype(np.float32)
        sample_scaling = np.stack([nanopolish.shift, nanopolish.scale], axis=1)
    mu = np.where(bad, np.float32(0), mu)
    sd = np.where(bad, np.float32(0), sd)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (mean - mu) / (np.sqrt(var) * sd)  # float32 (f5c) or double (nanopolish) denominator
    start = batch.ev_start[g].astype(np.int64)
    length = batch.ev_length[g]
    return EventalignRows(
        row_off=row_off,
        read=read,
        position=position,
        ref=ref,
        kmer_at=batch.ref_seq_off[read] + position - batch.ref_start[read],
        k=k,
        event_index=event,
        event_level_mean=mean.astype(np.float32),
        event_stdv=batch.ev_stdv[g],
        event_length=(length / batch.sample_rate[read].astype(np.float32)).astype(np.float32),
        model_rank=rank,
        model_mean=mu.astype(np.float32),
        model_stdv=sd.astype(np.float32),
        standardized_level=z.astype(np.float32),
        start_idx=start,
        end_idx=start + length.astype(np.int64),
        state=state,
        sample_scaling=sample_scaling,
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


FIXED_LIMIT = 2.0**20  # the row writer's exact range for float32 values (see `_scaled_int`)


@numba.njit(nogil=True, cache=True)
def _scaled_int(a, decimals):
    """round-half-even(a * 10^decimals) for a float32 value 0 <= a < 2^20, exactly (printf's `%.Nf`).

    a = m * 2^(e - 24) with an integer m < 2^24, so m * 10^decimals (below 2^41 for up to 5
    decimals) shifted right by 24 - e is the exact quotient; the remainder decides the rounding.
    """
    if a == 0.0:
        return np.int64(0)
    m, e = math.frexp(a)
    p = np.int64(m * 16777216.0) * np.int64(10) ** decimals
    sh = 24 - e
    if sh <= 0:
        return p << -sh
    if sh >= 62:
        return np.int64(0)
    q = p >> sh
    rem = p & ((np.int64(1) << sh) - 1)
    half = np.int64(1) << (sh - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    return q


@numba.njit(nogil=True, cache=True)
def _put_fixed(buf, pos, x, decimals, write):
    """x (a float32 value) as C's printf("%.<decimals>f") writes it; inf and nan as glibc spells them."""
    if x != x:
        for c in (110, 97, 110):
            pos = _put_byte(buf, pos, c, write)
        return pos
    if x < 0.0 or (x == 0.0 and math.copysign(1.0, x) < 0.0):
        pos = _put_byte(buf, pos, 45, write)
        x = -x
    if x == np.inf:
        for c in (105, 110, 102):
            pos = _put_byte(buf, pos, c, write)
        return pos
    v = _scaled_int(x, decimals)
    unit = np.int64(10) ** decimals
    pos = _put_uint(buf, pos, v // unit, write)
    pos = _put_byte(buf, pos, 46, write)
    frac = v % unit
    for d in range(decimals - 1, -1, -1):
        pos = _put_byte(buf, pos, 48 + (frac // np.int64(10) ** d) % 10, write)
    return pos


@numba.njit(nogil=True, cache=True)
def _put_kmer(buf, pos, rank, k, write):
    """The nucleotide k-mer of `rank`, or k N's for -1."""
    for j in range(k - 1, -1, -1):
        c = 78 if rank < 0 else _ACGT[(rank >> (2 * j)) & 3]
        pos = _put_byte(buf, pos, c, write)
    return pos


@numba.njit(nogil=True, cache=True)
def _tsv_row(buf, pos, j, read, position, ref, kmer_at, k, event, mean, stdv, length, rank, mmean, mstdv, z, start,
             end, contig, contig_off, label, label_off, signal_index, write):  # fmt: skip
    r = read[j]
    tab = 9
    pos = _put_bytes(buf, pos, contig, contig_off[r], contig_off[r + 1], write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_int(buf, pos, position[j], write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_bytes(buf, pos, ref, kmer_at[j], kmer_at[j] + k, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_bytes(buf, pos, label, label_off[r], label_off[r + 1], write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_byte(buf, pos, 116, write)  # strand: template
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_int(buf, pos, event[j], write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_fixed(buf, pos, mean[j], 2, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_fixed(buf, pos, stdv[j], 3, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_fixed(buf, pos, length[j], 5, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_kmer(buf, pos, rank[j], k, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_fixed(buf, pos, mmean[j], 2, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_fixed(buf, pos, mstdv[j], 2, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_fixed(buf, pos, z[j], 2, write)
    if signal_index:
        pos = _put_byte(buf, pos, tab, write)
        pos = _put_int(buf, pos, start[j], write)
        pos = _put_byte(buf, pos, tab, write)
        pos = _put_int(buf, pos, end[j], write)
    return _put_byte(buf, pos, 10, write)


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
    if all(np.all(~np.isfinite(v) | (np.abs(v) < FIXED_LIMIT)) for v in values):
        contig, contig_off = tsv.blob(batch.ref_names)
        label, label_off = tsv.blob(read_labels)
        text = write_rows(rows.read, rows.position, rows.ref, rows.kmer_at, rows.k, rows.event_index, *values[:3],
                          rows.model_rank, *values[3:], rows.start_idx, rows.end_idx, contig, contig_off, label,
                          label_off, options.signal_index).tobytes().decode()  # fmt: skip
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
            f"{read_index[i]}\t{batch.read_ids[i]}\t{paths[i]}\tdna\ttemplate\t{b - a}\t{steps}\t{skips}\t{stays}\t"
            f"{duration:.2f}\t{float(batch.shift[i]):.3f}\t{float(batch.scale[i]):.3f}\t0.000\t{float(batch.var[i]):.3f}\n"
        )
    return "".join(out)


@dataclass
class EventalignResult:
    """One batch through the stages: the batch (events, scalings), its rows, and the reads that gave none."""

    batch: ReadBatch
    rows: EventalignRows
    skipped: list[Skipped]
    timings: dict[str, float]


COMPAT = ("f5c", "nanopolish")

class EventalignPipeline(Pipeline):
    """The pipeline's stages up to recalibration, then eventalign instead of the CpG HMM.

    `compat` picks whose arithmetic eventalign follows (see the module docstring): "f5c" (1.1)
    or "nanopolish" (0.14). Both share the stages before it, which are f5c's.
    """

    calls_methylation = False

    def __init__(self, options: PipelineOptions = PipelineOptions(), scale_events: bool = False, compat: str = "f5c"):
        if compat not in COMPAT:
            raise ValueError(f"compat must be one of {COMPAT}, not {compat!r}")
        self.scale_events = scale_events  # before the warm-up batch runs
        self.compat = compat
        super().__init__(options)

    def run_batch(self, batch: ReadBatch) -> EventalignResult:  # type: ignore[override]
        timings: dict[str, float] = {}
        kmer = self.kmer_model

        def timed(name, fn, *args):
            t0 = time.perf_counter()
            with numba.parallel_chunksize(1):  # reads differ in length by orders of magnitude
                out = fn(*args)
            timings[name] = time.perf_counter() - t0
            return out

        batch.ev_off, batch.ev_start, batch.ev_length, batch.ev_mean, batch.ev_stdv = timed(
            "events", detect_events, batch.signal, batch.signal_off
        )
        batch.shift, batch.scale, batch.var = timed(
            "scaling", estimate_scalings, batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.status, kmer
        )
        args = (batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.status, batch.shift, batch.scale, kmer)
        if self.gpu is None:
            aln = timed("abea", align_batch, *args)
        else:
            with self._gpu_lock:
                aln, _ = timed("abea", self.gpu.align, *args)
        batch.aln_off, batch.aln_kmer, batch.aln_event = aln.aln_off, aln.aln_kmer, aln.aln_event
        post = timed(
            "postalign", recalibrate_batch, batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.aln_kmer,
            batch.aln_event, batch.aln_off, batch.status, batch.shift, batch.scale, batch.var, kmer,
        )  # fmt: skip
        nanopolish = None
        if self.compat == "nanopolish":
            np_model = nanopolish_model(kmer)
            again = recalibrate_batch(batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.aln_kmer,
                                      batch.aln_event, batch.aln_off, batch.status.copy(), batch.shift, batch.scale,
                                      batch.var, np_model)  # fmt: skip
            nanopolish = NanopolishScaling.from_recalibration(np_model, again.exact)
        batch.shift, batch.scale, batch.var = post.shift, post.scale, post.var
        with np.errstate(divide="ignore"):
            log_var = np.log(post.exact[:, 2])  # NaN for the reads not recalibrated, which give no rows
        rows = timed("eventalign", eventalign_batch, batch, kmer, post.b2e_start, post.kmer_off, post.events_per_base,
                     self.scale_events, log_var, nanopolish)  # fmt: skip
        skipped = [
            Skipped(batch.read_ids[i], Skip(int(batch.status[i])), f"signal from {batch.signal_paths[i]}")
            for i in np.flatnonzero(batch.status != Skip.OK).tolist()
        ]
        return EventalignResult(batch, rows, skipped, timings)


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
