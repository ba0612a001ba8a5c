"""Base-level extension: the DP's scores and gap placement, and CIGARs that account for every base
and score what the DP says, the same on one thread or several."""

from __future__ import annotations

import numpy as np
import pytest

from align_seeder import KmerSeeder
from streamer.align.bases import encode
from streamer.align.chain import chain
from streamer.align.extend import EXTEND, GLOBAL, OP_D, OP_I, OP_M, ExtendParams, _align, _scores, extend
from streamer.align.genome import synth_genome
from streamer.align.simulate import PROFILES, simulate_reads

P = ExtendParams()


def _run(q: str, r: str, mode=GLOBAL, w=10, rightmost=False):
    qc, rc = encode(q), encode(r)
    ops = np.zeros(len(qc) + len(rc) + 1, dtype=np.uint8)
    k, qu, ru, score = _align(qc, rc, mode, w, _scores(P), ops, rightmost)
    return "".join("MID"[o] for o in ops[:k][::-1]), qu, ru, score


def test_gaps_go_left_and_cost_two_piece():
    assert _run("AAC", "AAAC") == ("DMMM", 3, 4, 3 * 2 - (4 + 2))
    assert _run("GAAC", "GAAAC")[0] == "MDMMM"
    assert _run("GAAC", "GAAAC", rightmost=True)[0] == "MMMDM"
    rng = np.random.default_rng(1)
    left, right = ("".join("ACGT"[c] for c in rng.integers(0, 4, 40)) for _ in range(2))
    gone = "".join("ACGT"[c] for c in rng.integers(0, 4, 30))
    cigar, _, _, score = _run(left + right, left + gone + right, w=40)
    assert cigar == "M" * 40 + "D" * 30 + "M" * 40
    assert score == 80 * 2 - min(4 + 2 * 30, 24 + 30)  # the long gap's piece is the cheaper


def test_extension_stops_where_the_match_ends():
    rng = np.random.default_rng(2)
    shared = "".join("ACGT"[c] for c in rng.integers(0, 4, 300))
    q = shared + "".join("ACGT"[c] for c in rng.integers(0, 4, 600))
    r = shared + "".join("ACGT"[c] for c in rng.integers(0, 4, 800))
    cigar, qu, ru, score = _run(q, r, mode=EXTEND, w=50)
    assert 295 <= qu <= 320 and abs(qu - ru) <= 5 and score >= 590
    assert cigar.startswith("M" * 295)
    assert _run("", "ACGT", mode=EXTEND) == ("", 0, 0, 0)


def _rescore(cigar, q, r):
    s, nm, i, j = 0, 0, 0, 0
    for op, n in cigar:
        if op == OP_M:
            same = (q[i:i + n] == r[j:j + n]) & (q[i:i + n] < 4)
            s += int(same.sum()) * P.match - int((~same).sum()) * P.mismatch
            nm += int((~same).sum())
            i, j = i + n, j + n
        else:
            s -= min(P.gap_open + P.gap_extend * n, P.long_gap_open + P.long_gap_extend * n)
            nm += n
            i, j = (i + n, j) if op == OP_I else (i, j + n)
    return s, nm, i, j


@pytest.mark.parametrize("profile", ["r9", "r10"])
def test_cigars_account_for_every_base(profile):
    genome = synth_genome(300_000, seed=21, contigs=2)
    seeder = KmerSeeder.of(genome, k=15)
    reads = simulate_reads(genome, 30, PROFILES[profile], mean_length=2500, chimeras=0.2, seed=8)
    seeds = seeder(reads.codes, reads.offsets)
    chains = chain(seeds, np.diff(reads.offsets), seeder.contig_offsets)
    al = extend(chains, seeds, reads.codes, reads.offsets, seeder.genome, seeder.contig_offsets)
    for c in range(len(chains)):
        cig = al.cigar[al.cigar_off[c]:al.cigar_off[c + 1]]
        assert np.all(cig[:, 1] > 0) and np.all(cig[1:, 0] != cig[:-1, 0])
        assert set(cig[:, 0]) <= {OP_M, OP_I, OP_D} and cig[0, 0] == OP_M and cig[-1, 0] == OP_M
        read = reads.seq(chains.read[c])
        q = read[::-1].copy() if chains.rc[c] else read
        if chains.rc[c]:
            q = np.where(q < 4, 3 - q, q).astype(np.uint8)
        score, nm, i, j = _rescore(cig, q[al.qstart[c]:], seeder.genome[al.rstart[c]:])
        assert (i, j) == (al.qend[c] - al.qstart[c], al.rend[c] - al.rstart[c])
        assert (score, nm) == (al.score[c], al.nm[c])
        assert al.qstart[c] <= chains.qstart[c] and al.qend[c] >= chains.qend[c]
    threaded = extend(chains, seeds, reads.codes, reads.offsets, seeder.genome, seeder.contig_offsets, threads=2)
    assert np.array_equal(threaded.cigar, al.cigar) and np.array_equal(threaded.cigar_off, al.cigar_off)
    assert np.array_equal(threaded.rstart, al.rstart) and np.array_equal(threaded.score, al.score)
