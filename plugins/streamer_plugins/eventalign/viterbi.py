"""Eventalign's kernels: the per-piece Viterbi over the profile HMM and the walk along each
read's CIGAR (see the package docstring for the arithmetic they follow).

They take the batch's flat arrays, the model and the scalings, twenty or so, as numba needs;
`streamer_plugins.eventalign.rows.eventalign_batch` takes the batch record and unpacks it once."""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from streamer.pipeline.batch import CIGAR_N
from streamer_plugins.cpg.hmm import scaled_level, scaled_level64
from streamer_plugins.cpg.hmm_model import S_LOG_VAR, S_SCALE, S_SHIFT, S_VAR, STATE_B, STATE_K, STATE_M, T_BB, T_BK, T_BM_NEXT, T_BM_SELF, T_KK, T_KM, T_MB, T_MK, T_MM_NEXT, T_MM_SELF, block_transitions
from streamer_plugins.cpg.lookup import aligned_segments, closest_event

ALIGN_STRIDE = 100  # reference bases per HMM piece, about
OUTPUT_STRIDE = 50  # aligned events kept per piece, about (all of the last piece)

# Viterbi moves, in the order whose ties the tools break towards the later one.
FROM_SAME_M, FROM_PREV_M, FROM_SAME_B, FROM_PREV_B, FROM_PREV_K, FROM_SOFT = range(6)


STATE_CHAR_M = 77  # 'M'
STATE_CHAR_B = 66  # 'B'

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
    return scaled_level64(rank, model64, scalings64[S_SCALE], scalings64[S_SHIFT], scalings64[S_VAR],
                          scalings64[S_LOG_VAR])


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


