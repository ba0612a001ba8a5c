"""A synthetic CpG 9-mer model (alphabet ACGMT, 5^9 rows) whose M levels are known shifts of C's.

Nucleotide levels are drawn once from a fixed seed; a k-mer with M at positions p1, p2, ...
has the level of the same k-mer with C there, plus the sum of `methyl_shift(k)[p]` over those
positions (k-mer dependent, so a wrong position or strand shows in the scores).
"""

from __future__ import annotations

import numpy as np

import reference_hmm
from streamer.pore.model import METHYL_CPG, NUCLEOTIDE, PoreModel, logf
from streamer.pore.motifs import CPG
from streamer_plugins.cpg.hmm_model import HmmParams, pack_model, pack_scalings
from streamer_plugins.cpg.logsum import LOGSUM_TABLE

K = 9


def methyl_shift(k: int) -> np.ndarray:
    """pA added to a k-mer's level for an M at each position (first base first)."""
    return np.linspace(-3.0, 4.0, k).astype(np.float32)


def nucleotide_model(k: int = K, seed: int = 9) -> PoreModel:
    """The nucleotide k-mer levels the CpG model is built from."""
    rng = np.random.default_rng(seed)
    mean = rng.uniform(60.0, 120.0, 4**k).astype(np.float32)
    stdv = rng.uniform(1.0, 3.0, 4**k).astype(np.float32)
    return PoreModel(f"synthetic_{k}mer", k, NUCLEOTIDE, mean, stdv, logf(stdv))


def cpg_model(k: int = K, seed: int = 9) -> PoreModel:
    """Every ACGMT k-mer at its nucleotide k-mer's level (M read as C), shifted for each M."""
    nuc = nucleotide_model(k, seed)
    ranks = np.arange(5**k, dtype=np.int64)
    nuc_rank = np.zeros(5**k, np.int64)
    shift = np.zeros(5**k, np.float32)
    as_nucleotide = np.array([0, 1, 2, 1, 3])  # A C G M T -> A C G C T
    for pos, delta in enumerate(methyl_shift(k)):
        digit = ranks // 5 ** (k - 1 - pos) % 5
        nuc_rank = nuc_rank * 4 + as_nucleotide[digit]
        shift[digit == 3] += delta
    stdv = nuc.level_stdv[nuc_rank]
    return PoreModel(f"synthetic_cpg_{k}mer", k, METHYL_CPG, nuc.level_mean[nuc_rank] + shift, stdv, logf(stdv))


def events_for(model, window, rc, methylated, rng, noise=1.0, scale=1.05, shift=-2.0):
    """Events drawn from the model's k-mers of the window as read (1-3 per k-mer), with clipped flanks."""
    s = reference_hmm.methylate(window) if methylated else window
    if rc:
        s = reference_hmm.reverse_complement(s)
    levels = []
    for i in range(len(s) - model.k + 1):
        mu = model.level_mean[reference_hmm.rank(s[i : i + model.k])]
        levels += [scale * mu + shift + rng.normal() * noise for _ in range(rng.integers(1, 4))]
    return np.array(list(rng.uniform(70, 110, 3)) + levels + list(rng.uniform(70, 110, 4)), np.float32)


def synthetic_jobs(model: PoreModel, rng: np.random.Generator) -> tuple:
    """`score_windows` arguments for two reads (one per strand) of a reference with CpGs and four
    windows of theirs, events drawn from the model (the first read methylated)."""
    text = "AACGTTTTCGGATCCGATTACGCGTTAACGTTGCATCGAT" * 2
    ev0 = events_for(model, text[:40], False, True, rng)
    ev1 = events_for(model, text[40:], True, False, rng)
    n0, n = len(ev0), len(ev0) + len(ev1)
    jobs = dict(read=[0, 1, 1, 0], w0=[2, 0, 12, 10], w1=[30, 40, 35, 40], e1=[3, n - n0 - 4, 40, 20],
                e2=[n0 - 10, 2, 5, n0 - 3])  # fmt: skip
    j = [np.array(jobs[key], np.int64) for key in ("read", "w0", "w1", "e1", "e2")]
    scalings = pack_scalings(np.array([1.05, 1.05]), np.array([-2.0, -2.0]), np.array([1.0, 1.1]))
    return (*j, np.frombuffer(text.encode(), np.uint8), np.array([0, 40, 80]), np.array([False, True]),
            np.concatenate([ev0, ev1]), np.array([0, n0, n]), scalings, np.array([2.0, 2.1]), model.k,
            pack_model(model.level_mean, model.level_stdv), CPG.table(), CPG.marks(), HmmParams().as_array(),
            LOGSUM_TABLE, False)  # fmt: skip
