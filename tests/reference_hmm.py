"""Slow reference for the methylation HMM: strings, a full forward matrix, one cell at a time.

Written from the model's description, not from the kernel: the window is methylated and
reverse-complemented as strings, k-mers are ranked from those strings, and the whole
(events + 1) x 3(k-mers + 2) matrix is kept. With `exact=False` the arithmetic follows the
tools' precision (float32 cells, HMMER's table log-sum) and must equal the kernel bit for bit;
with `exact=True` it is float64 with exact log-sums, which the kernel approximates. Logs of
float32 values use libm's logf, as f5c (built as C++) does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.logf.restype = ctypes.c_float
_libm.logf.argtypes = [ctypes.c_float]

ALPHABET = "ACGMT"
COMPLEMENT = {"A": "T", "C": "G", "G": "C", "T": "A"}


def methylate(seq: str) -> str:
    """Every C of a CG becomes M."""
    return seq.replace("CG", "MG")


def reverse_complement(seq: str) -> str:
    """Reverse complement; an M (methylated C of a CG) maps to the M of the opposite strand's CG."""
    plain = seq.replace("M", "C")
    rc = "".join(COMPLEMENT[b] for b in reversed(plain))
    return methylate(rc) if "M" in seq else rc


def rank(kmer: str) -> int:
    r = 0
    for b in kmer:
        r = r * 5 + ALPHABET.index(b)
    return r


def _table_logsum(a, b):
    hi, lo = max(a, b), min(a, b)
    if lo == -np.inf or hi - lo >= np.float32(15.7):
        return hi
    idx = int((hi - lo) * np.float32(1000.0))
    return np.float32(hi + np.float32(math.log(1.0 + math.exp(-idx / 1000.0))))


def _exact_logsum(a, b):
    return float(np.logaddexp(a, b))


def forward(
    window: str,
    events: np.ndarray,
    e_start: int,
    e_stop: int,
    rc: bool,
    methylated: bool,
    level_mean: np.ndarray,
    level_stdv: np.ndarray,
    scale: float,
    shift: float,
    var: float,
    events_per_base: float,
    k: int = 6,
    exact: bool = False,
    p_skip: float = 0.0025,
    p_skip_self: float = 0.3,
    p_bad: float = 0.001,
    p_bad_self: float = 0.001,
    start_to_clip: float = 0.5,
    clip_self: float = 0.9,
    background: float = -3.0,
) -> float:
    """log P(events e_start..e_stop | window) with both flanks clippable."""
    f = (lambda x: float(x)) if exact else np.float32
    logsum = _exact_logsum if exact else _table_logsum
    seq = methylate(window) if methylated else window
    n_kmers = len(seq) - k + 1
    if rc:
        rc_seq = reverse_complement(seq)
        kmers = [rc_seq[len(seq) - i - k : len(seq) - i] for i in range(n_kmers)]
    else:
        kmers = [seq[i : i + k] for i in range(n_kmers)]
    ranks = [rank(km) for km in kmers]
    step = 1 if e_stop >= e_start else -1
    levels = [events[e] for e in range(e_start, e_stop + step, step)]
    n_ev = len(levels)

    # transitions (probabilities first, then logs, each stored at the working precision)
    p_stay = f(1.0 - 1.0 / events_per_base)
    one = f(1.0)
    p_mm_next = one - p_stay - f(p_skip) - f(p_bad)
    p_b_leave = (one - f(p_bad_self)) / f(3.0)
    # f5c is C++: the log of a float probability is logf
    lg = (lambda p: math.log(p)) if exact else (lambda p: np.float32(_libm.logf(float(p))))  # noqa: E731
    mm_self, mb, mk, mm_next = lg(p_stay), lg(f(p_bad)), lg(f(p_skip)), lg(p_mm_next)
    bb, b_leave = lg(f(p_bad_self)), lg(p_b_leave)
    kk, km = lg(f(p_skip_self)), lg(one - f(p_skip_self))

    # flanks: clipping the first i events, or every event after event i
    bg = float(f(background))
    pre = [f(math.log(1 - start_to_clip))]
    post = [f(math.log(1 - start_to_clip))]
    for i in range(1, n_ev):
        if i == 1:
            step_in = math.log(start_to_clip) + bg + math.log(1 - clip_self)
            pre.append(f(step_in))
            post.append(f(step_in))
        else:
            pre.append(f(math.log(clip_self) + bg + float(pre[-1])))
            post.append(f(math.log(clip_self) + bg + float(post[-1])))
    post.reverse()

    ninf = f(-np.inf)
    n_cols = 3 * (n_kmers + 2)
    K, B, M = 0, 1, 2
    mat = [[ninf] * n_cols for _ in range(n_ev + 1)]
    end = ninf
    sc, sh, vr = f(scale), f(shift), f(var)
    log_var = f(math.log(float(vr)))
    for row in range(1, n_ev + 1):
        x = f(levels[row - 1])
        for blk in range(1, n_kmers + 1):
            c, p = 3 * blk, 3 * (blk - 1)
            r = ranks[blk - 1]
            mu = sc * f(level_mean[r]) + sh
            sd = f(level_stdv[r]) * vr
            log_sd = lg(f(level_stdv[r])) + log_var
            z = (x - mu) / sd
            emit = f(-0.918938) - log_sd + f(-0.5) * z * z
            up = mat[row - 1]
            here = mat[row]
            terms = [
                mm_self + up[c + M],
                mm_next + up[p + M],
                b_leave + up[c + B],
                b_leave + up[p + B],
                km + up[p + K],
                pre[row - 1] if blk == 1 else ninf,
            ]
            s = terms[0]
            for t in terms[1:]:
                s = logsum(s, t)
            here[c + M] = s + emit
            here[c + B] = logsum(mb + up[c + M], bb + up[c + B])
            here[c + K] = logsum(logsum(mk + here[p + M], b_leave + here[p + B]), kk + here[p + K])
            if blk == n_kmers:
                for state in (M, B, K):
                    end = logsum(end, here[c + state] + post[row - 1])
    return float(end)
