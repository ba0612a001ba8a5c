"""Chaining's dynamic programme on the GPU: the CPU's chains (`streamer.align.chain.chain_groups`), from the
same cells (`streamer.align.chain_cells`) compiled for the device.

Each group (one read strand's anchors) is first put in order, by end on the reference, then on the read,
then as given: two stable passes of the device radix sort (`streamer_gpu.radix`), the minor key first,
and a thread per anchor gathers it and finds its contig. Then a block of THREADS threads (one warp) per
group runs the programme. The anchors go one after another, as each one's score needs those before it;
for each, the block tries THREADS predecessors at a time, a thread each (`candidate` and `joined`: the
loads and the gap cost, the costly part), and then every thread runs the skip rule over the round's
scores in order (`step`, reading shared memory: every lane the same instructions on the same values, so
each knows where the search stopped without being told). Rounds go on until a predecessor lies more
than max_gap back on the reference, the skip rule stops, or max_lookback is reached. Scores of two
rounds in a row go to two buffers, so one barrier a round orders them; thread 0 writes the anchor's
score and parent, and its sort key. The anchors are then sorted by (group, score descending, position),
the CPU's stable argsort of each group, and a thread per group reads its chains back (`read_back`). A
CUDA error chains the batch on the CPU, said in one line.
"""

from __future__ import annotations

import functools
import logging
import time

import numpy as np
from numba import cuda

from streamer.align.chain import REND_BITS, ChainParams, GroupChains, chain_groups
from streamer.align.chain_cells import FAR, JOIN, chain_cells, half_log2_table, table_size
from streamer_gpu.faults import from_env as fault_plan
from streamer_gpu.radix import sort_pairs
from streamer_gpu.target import CUDA_ERRORS, DEVICE, SIMULATED

log = logging.getLogger(__name__)

# a warp per group; the simulator runs a Python thread per GPU thread: fewer there (more rounds an anchor)
THREADS = 8 if SIMULATED else 32
BLOCK = 128  # threads of a block where a thread takes a whole group
SCORE_BITS = 32  # a score is at most its anchor's end on the read (int32 positions)


@functools.cache
def kernels():
    """The ordering's, the programme's and the read-back's kernels, compiled on first use."""
    c = chain_cells(DEVICE)
    gap_slope, candidate, joined, step, read_back = c.gap_slope, c.candidate, c.joined, c.step, c.read_back

    @cuda.jit
    def programme(qs, rs, ln, ctg, grp_off, max_gap, bandwidth, max_lookback, max_skip, gap_scale, half_log2, f,
                  p, keys, vals):  # fmt: skip
        """Block g: the scores and parents of group g's anchors, and their sort keys."""
        g = cuda.blockIdx.x
        t = cuda.threadIdx.x
        a, b = grp_off[g], grp_off[g + 1]
        kinds = cuda.shared.array((2, THREADS), np.int64)
        scores = cuda.shared.array((2, THREADS), np.int64)
        part = cuda.shared.array(THREADS, np.int64)
        s = 0
        for i in range(a + t, b, THREADS):
            s += ln[i]
        part[t] = s
        cuda.syncthreads()
        total = 0
        for u in range(THREADS):
            total += part[u]
        slope = gap_slope(total, b - a, gap_scale)
        buf = 0
        for i in range(a, b):
            lo = i - max_lookback
            if lo < a:
                lo = a
            best, parent, skipped = ln[i], np.int64(-1), np.int64(0)
            top = i - 1
            done = top < lo
            while not done:
                j = top - t
                kind, score = FAR, np.int64(0)
                if j >= lo:
                    kind, gap, bases = candidate(qs[i], rs[i], ln[i], ctg[i], qs[j], rs[j], ln[j], ctg[j], max_gap,
                                                 bandwidth)  # fmt: skip
                    if kind == JOIN:
                        score = joined(f[j], bases, gap, slope, half_log2[gap])
                kinds[buf, t] = kind
                scores[buf, t] = score
                cuda.syncthreads()
                for u in range(THREADS):
                    k = kinds[buf, u]
                    if k == FAR:
                        done = True
                        break
                    if k == JOIN:
                        best, parent, skipped, stop = step(scores[buf, u], top - u, best, parent, skipped, max_skip)
                        if stop:
                            done = True
                            break
                buf = 1 - buf
                top -= THREADS
                done = done or top < lo
            if t == 0:
                # read by the next anchor's thread 0 (this thread) at once, by the others after its round's barrier
                f[i] = best
                p[i] = parent
                keys[i] = (np.int64(g) << SCORE_BITS) + ((np.int64(1) << SCORE_BITS) - 1 - best)
                vals[i] = i

    @cuda.jit
    def by_read_end(grp_off, qpos, length, group, keys, vals):
        """Block g: its anchors' group, and their end on the read as the first sort's keys."""
        g = cuda.blockIdx.x
        for i in range(grp_off[g] + cuda.threadIdx.x, grp_off[g + 1], THREADS):
            group[i] = g
            keys[i] = qpos[i] + length[i]
            vals[i] = i

    @cuda.jit
    def by_group_ref_end(n, group, rpos, length, vals, keys):
        """The second sort's keys: (group, end on the reference) of the anchors the first sort put at each place."""
        k = cuda.grid(1)
        if k < n:
            i = vals[k]
            keys[k] = (np.int64(group[i]) << REND_BITS) + rpos[i] + length[i]

    @cuda.jit
    def gather(n, order, qpos, rpos, length, contig_offsets, qs, rs, ln, ctg):
        """The anchors in chaining's order, and the contig of each (the last contig start at or before it)."""
        k = cuda.grid(1)
        if k < n:
            i = order[k]
            qs[k] = qpos[i]
            rs[k] = rpos[i]
            ln[k] = length[i]
            lo, hi = 0, contig_offsets.shape[0]
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if contig_offsets[mid] <= rpos[i]:
                    lo = mid
                else:
                    hi = mid
            ctg[k] = lo

    @cuda.jit
    def chains(f, p, order, used, path, grp_off, n_groups, min_score, min_anchors, c_score, c_first, c_count, c_n,
               anchor_out):  # fmt: skip
        g = cuda.grid(1)
        if g < n_groups:
            c_n[g] = read_back(f, p, order, used, path, grp_off[g], grp_off[g + 1], min_score, min_anchors, c_score,
                               c_first, c_count, anchor_out)  # fmt: skip

    return by_read_end, by_group_ref_end, gather, programme, chains


class CudaChainer:
    """`chain_groups` on the current GPU; a CUDA error chains the batch on the CPU, said in one line."""

    def __init__(self):
        self._kernels = kernels()
        self._faults = fault_plan()
        self.seconds: dict[str, float] = {}  # wall seconds of the copies in, the ordering, the programme, the
        # read-back (its sort included) and the copies out, summed

    def chain_groups(self, qpos: np.ndarray, rpos: np.ndarray, length: np.ndarray, grp_off: np.ndarray,
                     contig_offsets: np.ndarray, params: ChainParams) -> GroupChains:  # fmt: skip
        try:
            self._faults.check("chain")
            return self._run(qpos, rpos, length, grp_off, contig_offsets, params)
        except CUDA_ERRORS as exc:
            log.warning("GPU chaining failed on %d read strands (%s: %s): they are chained on the CPU",
                        len(grp_off) - 1, type(exc).__name__, exc)  # fmt: skip
            return chain_groups(qpos, rpos, length, grp_off, contig_offsets, params)

    def _run(self, qpos, rpos, length, grp_off, contig_offsets, params):
        n, n_groups = len(qpos), len(grp_off) - 1
        if n == 0:
            return chain_groups(qpos, rpos, length, grp_off, contig_offsets, params)
        by_read_end, by_group_ref_end, gather, programme, chains = self._kernels
        prm = params
        grid = (n + BLOCK - 1) // BLOCK
        t0 = time.perf_counter()
        d_qpos, d_rpos, d_length, d_off, d_ctg_off = (cuda.to_device(x) for x in (qpos, rpos, length, grp_off,
                                                                                 contig_offsets))  # fmt: skip
        d_log = cuda.to_device(half_log2_table(table_size(prm.max_gap, prm.bandwidth)))
        qs, rs, ln, ctg, f, p, order, by_score, tmp_vals, path = (cuda.device_array(n, np.int64) for _ in range(10))
        keys, tmp_keys = cuda.device_array(n, np.uint64), cuda.device_array(n, np.uint64)
        group = cuda.device_array(n, np.int32)
        used = cuda.to_device(np.zeros(n, np.bool_))
        out = [cuda.device_array(n, np.int64) for _ in range(3)]
        c_n, anchor_out = cuda.device_array(n_groups, np.int64), cuda.device_array(n, np.int64)
        cuda.synchronize()
        t1 = time.perf_counter()
        # each group by end on the reference, then on the read, then as given: two stable sorts, the minor first
        by_read_end[n_groups, THREADS](d_off, d_qpos, d_length, group, keys, order)
        sort_pairs(keys, order, tmp_keys, tmp_vals)
        by_group_ref_end[grid, BLOCK](n, group, d_rpos, d_length, order, keys)
        sort_pairs(keys, order, tmp_keys, tmp_vals)
        gather[grid, BLOCK](n, order, d_qpos, d_rpos, d_length, d_ctg_off, qs, rs, ln, ctg)
        cuda.synchronize()
        t2 = time.perf_counter()
        programme[n_groups, THREADS](qs, rs, ln, ctg, d_off, prm.max_gap, prm.bandwidth, prm.max_lookback,
                                     prm.max_skip, prm.gap_scale, d_log, f, p, keys, by_score)  # fmt: skip
        cuda.synchronize()
        t3 = time.perf_counter()
        sort_pairs(keys, by_score, tmp_keys, tmp_vals)
        chains[(n_groups + BLOCK - 1) // BLOCK, BLOCK](f, p, by_score, used, path, d_off, n_groups, prm.min_score,
                                                       prm.min_anchors, *out, c_n, anchor_out)  # fmt: skip
        cuda.synchronize()
        t4 = time.perf_counter()
        host = GroupChains(order.copy_to_host(), *(a.copy_to_host() for a in out), c_n.copy_to_host(),
                           anchor_out.copy_to_host())  # fmt: skip
        t5 = time.perf_counter()
        for key, dt in (("h2d", t1 - t0), ("order", t2 - t1), ("programme", t3 - t2), ("read_back", t4 - t3),
                        ("d2h", t5 - t4)):  # fmt: skip
            self.seconds[key] = self.seconds.get(key, 0.0) + dt
        return host


_chainers: dict[int, CudaChainer] = {}


def chainer_for() -> CudaChainer:
    """The chainer of the current GPU."""
    dev = getattr(cuda.current_context().device, "id", 0)  # the simulator's device has none
    if dev not in _chainers:
        _chainers[dev] = CudaChainer()
    return _chainers[dev]
