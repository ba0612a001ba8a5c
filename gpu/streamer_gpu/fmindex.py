"""The FM-index built on the GPU, and seeding on it: the same bytes and the same seeds as the CPU's
(`streamer.align.fmindex`, `streamer.align.seeds`), from the same cells (`streamer.align.fm_cells`)
compiled for the device.

The build follows the CPU's steps, each a kernel over the text or a piece's suffixes: a thread per
suffix counts the 7-symbol buckets; a piece of whole buckets (`streamer.align.suffixes.plan_pieces`,
within the memory budget) is gathered into its buckets' slots with atomic cursors and sorted by its
21-symbol keys with the device radix sort (`streamer_gpu.radix`); a thread per run of tied suffixes
refines it deeper; a thread per row writes the BWT code and the sampled entry; a thread per block of
64 rows packs them; a thread per k-mer fills the k-mer table, one length at a time. The gather's
order within a bucket is the atomics', but every suffix ends in one place, so the bytes are the
CPU's. The host only turns counts into offsets (the checkpoints' running counts included).

Seeding keeps the index on the device (one `CudaFmSeeder` per index and device) and runs a chunk of
read ends as the CPU does: a thread per window of WINDOW ends, a thread per end for the counts, a
thread per seeding end for the locates, a thread per read strand for the order; the offsets are the counts' running sums, formed on the device (`streamer_gpu.scan`). A CUDA
error seeds that chunk on the CPU, said in one line.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref

import numpy as np
from numba import cuda

from streamer.align.fm_cells import BLOCK_ROWS, KEY_SYMBOLS, fm_cells
from streamer.align.fmindex import FMIndex, Text, checkpoint, empty_parts, kmer_len_for, max_piece_for, sep_order
from streamer.align.seeds import REACH, WINDOW, chunk_seeds, seed_arrays, window_offsets
from streamer.align.suffixes import BUCKET_SHIFT, N_BUCKETS, plan_pieces
from streamer_gpu.faults import from_env as fault_plan
from streamer_gpu.radix import sort_pairs
from streamer_gpu.scan import running_sums
from streamer_gpu.target import CUDA_ERRORS, DEVICE

log = logging.getLogger(__name__)

BLOCK = 128


def grid(n: int) -> int:
    return max(1, (n + BLOCK - 1) // BLOCK)


@functools.cache
def build_kernels():
    """The build's kernels, compiled on first use so that importing this module needs no GPU."""
    c = fm_cells(DEVICE)
    suffix_key, refine_run, emit_row, pack_block, kmer_step = (c.suffix_key, c.refine_run, c.emit_row, c.pack_block,
                                                               c.kmer_step)  # fmt: skip

    @cuda.jit
    def buckets(text, n, counts):
        i = cuda.grid(1)
        if i < n:
            cuda.atomic.add(counts, np.int64(suffix_key(text, n, i) >> BUCKET_SHIFT), 1)

    @cuda.jit
    def gather(text, n, first, last, cursor, pos, keys):
        i = cuda.grid(1)
        if i < n:
            key = suffix_key(text, n, i)
            b = np.int64(key >> BUCKET_SHIFT)
            if first <= b < last:
                at = cuda.atomic.add(cursor, b - first, 1)
                pos[at] = i
                keys[at] = key

    @cuda.jit
    def tied_runs(keys, m, brk, starts, ends, n_runs):
        """brk as `streamer.align.suffixes.tied_runs` sets it, and each run of more than one listed."""
        i = cuda.grid(1)
        if i < m:
            brk[i] = 1 if i == 0 or keys[i] != keys[i - 1] else 0
            if brk[i] == 1 and i + 1 < m and keys[i + 1] == keys[i]:
                j = i + 1
                while j < m and keys[j] == keys[i]:
                    j += 1
                r = cuda.atomic.add(n_runs, 0, 1)
                starts[r] = i
                ends[r] = j

    @cuda.jit
    def refine(text, n, pos, keys, brk, starts, ends, count):
        r = cuda.grid(1)
        if r < count:
            refine_run(text, n, pos, keys, brk, starts[r], ends[r], KEY_SYMBOLS)

    @cuda.jit
    def emit(text, n, seg_text, pos, m, row0, codes, ssa, seg_row):
        r = cuda.grid(1)
        if r < m:
            emit_row(text, n, seg_text, pos[r], row0 + r, codes, ssa, seg_row)

    @cuda.jit
    def pack(codes, n, n_blocks, bwt, counts):
        b = cuda.grid(1)
        if b < n_blocks:
            a, cc, g, t = pack_block(codes, n, b, bwt)
            counts[b, 0] = a
            counts[b, 1] = cc
            counts[b, 2] = g
            counts[b, 3] = t

    @cuda.jit
    def kmers(bwt, cum, sep_rows, prev_lo, prev_hi, nxt_lo, nxt_hi, level, count):
        x = cuda.grid(1)
        if x < count:
            kmer_step(bwt, cum, sep_rows, prev_lo, prev_hi, nxt_lo, nxt_hi, level, x)

    return buckets, gather, tied_runs, refine, emit, pack, kmers


def build(text: Text, budget: int, kmer_len: int | None = None) -> FMIndex:
    """`streamer.align.fmindex.build_index` on the current GPU."""
    buckets, gather, tied_runs, refine, emit, pack, kmers = build_kernels()
    n = len(text.codes)
    d_text, d_seg_text = cuda.to_device(text.codes), cuda.to_device(text.seg_text)
    codes, ssa, seg_row = empty_parts(text)
    d_codes, d_ssa, d_seg_row = cuda.device_array_like(codes), cuda.to_device(ssa), cuda.device_array_like(seg_row)
    d_counts = cuda.to_device(np.zeros(N_BUCKETS, np.int64))
    buckets[grid(n), BLOCK](d_text, n, d_counts)
    counts = d_counts.copy_to_host()
    pieces = list(plan_pieces(counts, max_piece_for(budget)))
    largest = max(p.size for p in pieces)
    pos, keys = cuda.device_array(largest, np.int64), cuda.device_array(largest, np.uint64)
    tmp_pos, tmp_keys = cuda.device_array(largest, np.int64), cuda.device_array(largest, np.uint64)
    brk = cuda.device_array(largest, np.uint8)
    starts, ends = cuda.device_array(largest // 2 + 1, np.int64), cuda.device_array(largest // 2 + 1, np.int64)
    for piece in pieces:
        m = piece.size
        cursor = np.zeros(piece.last - piece.first, np.int64)
        np.cumsum(counts[piece.first : piece.last - 1], out=cursor[1:])
        gather[grid(n), BLOCK](d_text, n, piece.first, piece.last, cuda.to_device(cursor), pos, keys)
        sort_pairs(keys[:m], pos[:m], tmp_keys[:m], tmp_pos[:m])
        n_runs = cuda.to_device(np.zeros(1, np.int64))
        tied_runs[grid(m), BLOCK](keys, m, brk, starts, ends, n_runs)
        count = int(n_runs.copy_to_host()[0])
        if count:
            refine[grid(count), BLOCK](d_text, n, pos, keys, brk, starts, ends, count)
        emit[grid(m), BLOCK](d_text, n, d_seg_text, pos, m, piece.row, d_codes, d_ssa, d_seg_row)
    n_blocks = n // BLOCK_ROWS + 1
    d_bwt = cuda.to_device(np.zeros(4 * n_blocks, np.uint64))
    d_block_counts = cuda.device_array((n_blocks, 4), np.int64)
    pack[grid(n_blocks), BLOCK](d_codes, n, n_blocks, d_bwt, d_block_counts)
    bwt = d_bwt.copy_to_host()
    cum = checkpoint(bwt, d_block_counts.copy_to_host(), len(text.seg_text))
    sep_rows, sep_sa = sep_order(text, d_seg_row.copy_to_host())
    d_bwt, d_cum, d_sep_rows = cuda.to_device(bwt), cuda.to_device(cum), cuda.to_device(sep_rows)
    lo, hi = cuda.to_device(np.zeros(1, np.uint32)), cuda.to_device(np.full(1, cum[4], np.uint32))
    for level in range(kmer_len_for(n) if kmer_len is None else kmer_len):
        count = 4 ** (level + 1)
        nlo, nhi = cuda.device_array(count, np.uint32), cuda.device_array(count, np.uint32)
        kmers[grid(count), BLOCK](d_bwt, d_cum, d_sep_rows, lo, hi, nlo, nhi, level, count)
        lo, hi = nlo, nhi
    return FMIndex(text.names, text.contig_offsets, text.seg_text, text.seg_ref, cum, bwt, sep_rows, sep_sa,
                   d_ssa.copy_to_host(), lo.copy_to_host(), hi.copy_to_host())  # fmt: skip


@functools.cache
def seed_kernels():
    """Seeding's kernels, compiled on first use."""
    c = fm_cells(DEVICE)
    window_of, end_of, match_window = c.window_of, c.end_of, c.match_window
    smem_count, fill_smem, order_seeds = c.smem_count, c.fill_smem, c.order_seeds

    @cuda.jit
    def windows(bwt, cum, sep_rows, kmer_lo, kmer_hi, k, q, job_off, win_off, n_win, min_len, starts, lo, hi):
        """A thread per window of WINDOW ends."""
        w = cuda.grid(1)
        if w < n_win:
            sizes = cuda.local.array(REACH, np.int64)
            a, e_lo, e_hi = window_of(job_off, win_off, w, WINDOW)
            match_window(bwt, cum, sep_rows, kmer_lo, kmer_hi, k, q, a, e_lo, e_hi, min_len, starts, lo, hi, a, sizes)

    @cuda.jit
    def count(job_off, n_ends, starts, lo, hi, max_occ, counts):
        g = cuda.grid(1)
        if g < n_ends:
            _, e, m = end_of(job_off, g)
            counts[g] = smem_count(starts, lo, hi, g, e, m, max_occ)

    @cuda.jit
    def fill(bwt, cum, sep_rows, sep_sa, ssa, seg_text, seg_ref, job_off, j0, n_ends, starts, lo, hi, at, read, qpos,
             rpos, length, rc):  # fmt: skip
        g = cuda.grid(1)
        if g < n_ends and at[g + 1] > at[g]:
            j, e, _ = end_of(job_off, g)
            fill_smem(bwt, cum, sep_rows, sep_sa, ssa, seg_text, seg_ref, starts, lo, hi, g, e, j0 + j, at[g], read,
                      qpos, rpos, length, rc)  # fmt: skip

    @cuda.jit
    def order(job_off, n_jobs, at, rpos, qpos, keys, perm):
        j = cuda.grid(1)
        if j < n_jobs:
            order_seeds(rpos, qpos, keys, perm, at[job_off[j]], at[job_off[j + 1]])

    @cuda.jit
    def permute(perm, n, read, qpos, rpos, length, rc, o_read, o_qpos, o_rpos, o_length, o_rc):
        i = cuda.grid(1)
        if i < n:
            p = perm[i]
            o_read[i] = read[p]
            o_qpos[i] = qpos[p]
            o_rpos[i] = rpos[p]
            o_length[i] = length[p]
            o_rc[i] = rc[p]

    return windows, count, fill, order, permute


class CudaFmSeeder:
    """One index on one GPU: `chunk_seeds` as `streamer.align.seeds.chunk_seeds` computes them."""

    def __init__(self, index: FMIndex):
        self.index = index
        ix = index
        self._d = {name: cuda.to_device(getattr(ix, name)) for name in
                   ("bwt", "cum", "sep_rows", "sep_sa", "ssa", "seg_text", "seg_ref", "kmer_lo", "kmer_hi")}  # fmt: skip
        self._kernels = seed_kernels()
        self._faults = fault_plan()
        self.seconds: dict[str, float] = {}  # wall seconds of the chunks' copies in, matching (with the
        # counts' running sums), locating and ordering, copies out

    def chunk_seeds(self, q: np.ndarray, job_off: np.ndarray, j0: int, j1: int, min_len: int,
                    max_occ: int) -> tuple[np.ndarray, ...]:  # fmt: skip
        try:
            self._faults.check("seeds")
            return self._run(q, job_off, j0, j1, min_len, max_occ)
        except CUDA_ERRORS as exc:
            log.warning("GPU seeding failed on %d read strands (%s: %s): they are seeded on the CPU", j1 - j0,
                        type(exc).__name__, exc)  # fmt: skip
            return chunk_seeds(self.index, q, job_off, j0, j1, min_len, max_occ)

    def _run(self, q, job_off, j0, j1, min_len, max_occ):
        windows, count, fill, order, permute = self._kernels
        d = self._d
        local_off = job_off[j0 : j1 + 1] - job_off[j0]
        n_ends, n_jobs = int(local_off[-1]), j1 - j0
        if n_ends == 0:
            return seed_arrays(0)
        t0 = time.perf_counter()
        win_off = window_offsets(local_off)
        n_win = int(win_off[-1])
        d_q, d_off, d_win = (cuda.to_device(q[job_off[j0] : job_off[j1]]), cuda.to_device(local_off),
                             cuda.to_device(win_off))  # fmt: skip
        starts, lo, hi = (cuda.device_array(n_ends, np.int32), cuda.device_array(n_ends, np.uint32),
                          cuda.device_array(n_ends, np.uint32))  # fmt: skip
        counts = cuda.device_array(n_ends, np.int64)
        cuda.synchronize()
        t1 = time.perf_counter()
        windows[grid(n_win), BLOCK](d["bwt"], d["cum"], d["sep_rows"], d["kmer_lo"], d["kmer_hi"], self.index.kmer_len,
                                    d_q, d_off, d_win, n_win, min_len, starts, lo, hi)  # fmt: skip
        count[grid(n_ends), BLOCK](d_off, n_ends, starts, lo, hi, max_occ, counts)
        d_at, n_seeds = running_sums(counts)
        cuda.synchronize()
        t2 = time.perf_counter()
        out = [cuda.device_array(n_seeds, a.dtype) for a in seed_arrays(0)]
        if n_seeds:
            fill[grid(n_ends), BLOCK](d["bwt"], d["cum"], d["sep_rows"], d["sep_sa"], d["ssa"], d["seg_text"],
                                      d["seg_ref"], d_off, j0, n_ends, starts, lo, hi, d_at, *out)  # fmt: skip
            keys, perm = cuda.device_array(n_seeds, np.int64), cuda.device_array(n_seeds, np.int64)
            order[grid(n_jobs), BLOCK](d_off, n_jobs, d_at, out[2], out[1], keys, perm)
            ordered = [cuda.device_array(n_seeds, a.dtype) for a in out]
            permute[grid(n_seeds), BLOCK](perm, n_seeds, *out, *ordered)
            out = ordered
        cuda.synchronize()
        t3 = time.perf_counter()
        host = tuple(a.copy_to_host() if n_seeds else np.zeros(0, a.dtype) for a in out)
        t4 = time.perf_counter()
        for key, dt in (("h2d", t1 - t0), ("match", t2 - t1), ("locate", t3 - t2), ("d2h", t4 - t3)):
            self.seconds[key] = self.seconds.get(key, 0.0) + dt
        return host


_seeders: weakref.WeakKeyDictionary[FMIndex, dict[int, CudaFmSeeder]] = weakref.WeakKeyDictionary()


def seeder_for(index: FMIndex) -> CudaFmSeeder:
    """The seeder of index on the current GPU, its arrays copied there once."""
    by_device = _seeders.setdefault(index, {})
    dev = getattr(cuda.current_context().device, "id", 0)  # the simulator's device has none
    if dev not in by_device:
        by_device[dev] = CudaFmSeeder(index)
    return by_device[dev]

