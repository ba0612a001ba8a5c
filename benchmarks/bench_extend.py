"""The base-level step of alignment, three ways on the same jobs: the numba banded DP of
`streamer.align.extend`, edlib (Myers' bit-vector edit distance) and parasail (striped SIMD,
affine gaps), each called once per job from Python.

Jobs are what extension meets: the stretches between two seeds (reference slices of exponential
length, mean --gap, copied with the profile's errors to make the read's side) and, for scale,
whole reads of 2-5 kb aligned end to end. Every CIGAR is then scored with minimap2's map-ont scores
(match 2, mismatch 4, gaps min(4 + 2l, 24 + l)), so the table says both how fast and how good.
Times are of the aligning alone (each aligner's own output, not yet turned into runs).

    pip install edlib parasail   # for the comparison only: neither is a dependency of streamer
    python benchmarks/bench_extend.py --jobs 20000 --profile r9
"""

from __future__ import annotations

import argparse
import re
import time

import numba
import numpy as np

from streamer.align.bases import decode
from streamer.align.extend import GLOBAL, ExtendParams, _align, _scores
from streamer.align.genome import mutate, seed_bases
from streamer.align.simulate import PROFILES


def _jobs(lengths: np.ndarray, profile, rng) -> list[tuple[np.ndarray, np.ndarray]]:
    seed_bases(int(rng.integers(2**31)))
    out = []
    for length in np.maximum(1, lengths.astype(int)):
        ref = rng.integers(0, 4, length).astype(np.uint8)
        buf = np.empty(2 * length + 16, dtype=np.uint8)
        read = buf[:mutate(ref, profile.sub, profile.ins, profile.dele, buf)].copy()
        if len(read):
            out.append((read, ref))
    return out


def _affine_score(cigar: list[tuple[str, int]], q: np.ndarray, r: np.ndarray, p: ExtendParams) -> int:
    s, i, j = 0, 0, 0
    for op, n in cigar:
        if op in "M=X":
            same = q[i:i + n] == r[j:j + n]
            s += int(same.sum()) * p.match - int((~same).sum()) * p.mismatch
            i, j = i + n, j + n
        else:
            s -= min(p.gap_open + p.gap_extend * n, p.long_gap_open + p.long_gap_extend * n)
            i, j = (i + n, j) if op == "I" else (i, j + n)
    assert i == len(q) and j == len(r)
    return s


def _runs(ops: np.ndarray) -> list[tuple[str, int]]:
    starts = np.flatnonzero(np.diff(ops, prepend=np.uint8(255)))
    return list(zip(("MID"[o] for o in ops[starts]), np.diff(starts, append=len(ops)).tolist()))


def _numba(jobs, p):
    sc = _scores(p)
    out = []
    for q, r in jobs:
        ops = np.empty(len(q) + len(r) + 1, dtype=np.uint8)
        k, _, _, _ = _align(q, r, GLOBAL, p.gap_band, sc, ops)
        out.append(ops[:k])
    return out, lambda raw: [_runs(ops[::-1]) for ops in raw]


@numba.njit(nogil=True)
def _align_all(q_all, q_off, r_all, r_off, w, sc, ops_all, ops_off, n_ops):
    for t in range(len(q_off) - 1):
        n_ops[t] = _align(q_all[q_off[t]:q_off[t + 1]], r_all[r_off[t]:r_off[t + 1]], GLOBAL, w, sc,
                          ops_all[ops_off[t]:ops_off[t + 1]])[0]


def _numba_batched(jobs, p):
    """As `extend_chains` runs it: every job in one compiled loop, no call from Python per job."""
    q_off = np.concatenate([[0], np.cumsum([len(q) for q, _ in jobs])])
    r_off = np.concatenate([[0], np.cumsum([len(r) for _, r in jobs])])
    ops_off = q_off + r_off + np.arange(len(q_off))
    ops = np.empty(ops_off[-1], dtype=np.uint8)
    n_ops = np.zeros(len(jobs), dtype=np.int64)
    _align_all(np.concatenate([q for q, _ in jobs]), q_off, np.concatenate([r for _, r in jobs]), r_off, p.gap_band,
               _scores(p), ops, ops_off, n_ops)
    return None, lambda _: [_runs(ops[ops_off[t]:ops_off[t] + n_ops[t]][::-1]) for t in range(len(jobs))]


def _edlib(jobs, p):
    import edlib

    raw = [edlib.align(decode(q), decode(r), mode="NW", task="path")["cigar"] for q, r in jobs]
    return raw, lambda raw: [_parsed(c) for c in raw]


def _parasail(jobs, p):
    import parasail

    matrix = parasail.matrix_create("ACGT", p.match, -p.mismatch)
    raw = [parasail.nw_trace_striped_sat(decode(q), decode(r), p.gap_open + p.gap_extend, p.gap_extend, matrix).cigar
           for q, r in jobs]
    return raw, lambda raw: [_parsed(c.decode if isinstance(c.decode, str) else c.decode.decode()) for c in raw]


def _parsed(cigar: str) -> list[tuple[str, int]]:
    return [(op if op in "ID" else "M", int(n)) for n, op in re.findall(r"(\d+)([=XIDM])", cigar)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--gap", type=float, default=60.0, help="mean stretch between seeds [60]")
    ap.add_argument("--reads", type=int, default=200, help="whole reads of 2-5 kb [200]")
    ap.add_argument("--profile", choices=sorted(PROFILES), default="r9")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    prof = PROFILES[args.profile]
    p = ExtendParams()
    sets = {"between seeds": _jobs(rng.exponential(args.gap, args.jobs), prof, rng),
            "whole reads": _jobs(rng.uniform(2000, 5000, args.reads), prof, rng)}
    _numba(sets["between seeds"][:10], p)  # compile
    _numba_batched(sets["between seeds"][:10], p)
    print(f"profile {args.profile}; scores: map-ont's; times: per set, one thread\n")
    print("| jobs | bases | aligner | seconds | Mbases/s | map-ont score (sum) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, jobs in sets.items():
        bases = sum(len(q) for q, _ in jobs)
        for label, fn in (("numba banded DP", _numba), ("numba, one call for all", _numba_batched), ("edlib", _edlib),
                          ("parasail striped", _parasail)):
            t = time.perf_counter()
            raw, convert = fn(jobs, p)
            dt = time.perf_counter() - t
            cigars = convert(raw)
            score = sum(_affine_score(c, q, r, p) for c, (q, r) in zip(cigars, jobs))
            print(f"| {name} ({len(jobs)}) | {bases:,} | {label} | {dt:.3f} | {bases / dt / 1e6:.2f} | {score:,} |")


if __name__ == "__main__":
    main()
