"""Chaining: the primary chain lands where the simulator put the read, chimeras get a supplementary
part, exact repeats get MAPQ 0 and a secondary, and the dynamic programme keeps to its rules."""

from __future__ import annotations

import numpy as np
import pytest

from align_seeder import KmerSeeder
from streamer.align.anchors import Seeds
from streamer.align.chain import PRIMARY, SECONDARY, ChainParams, chain
from streamer.align.genome import synth_genome
from streamer.align.simulate import PROFILES, simulate_reads


@pytest.fixture(scope="module")
def genome():
    return synth_genome(1_000_000, seed=11, contigs=2)


@pytest.fixture(scope="module")
def seeder(genome):
    return KmerSeeder.of(genome, k=15)


def _on_truth(chains, c, truth_row, names, offsets) -> bool:
    _, _, ctg, start, end, strand, _, _ = truth_row
    off = offsets[chains.contig[c]]
    overlap = min(chains.rend[c] - off, end) - max(chains.rstart[c] - off, start)
    return names[chains.contig[c]] == ctg and bool(chains.rc[c]) == (strand == "-") and overlap > 0.8 * (end - start)


def _truth_by_read(reads):
    out = {}
    for row in reads.truth:
        out.setdefault(row[0], []).append(row)
    return out


@pytest.mark.parametrize("profile", ["r9", "r10"])
def test_primary_chains_land_on_the_truth(genome, seeder, profile):
    reads = simulate_reads(genome, 150, PROFILES[profile], mean_length=3000, chimeras=0.15, seed=4)
    chains = chain(seeder(reads.codes, reads.offsets), np.diff(reads.offsets), seeder.contig_offsets)
    names = [n for n, _ in genome]
    truth = _truth_by_read(reads)
    single = good = confident = chimeras_split = n_chimeras = 0
    for i, rid in enumerate(reads.names):
        mine = np.flatnonzero(chains.read == i)
        assert len(mine) and chains.role[mine[0]] == PRIMARY  # every read maps; its primary first
        assert list(chains.role[mine]) == sorted(chains.role[mine])
        rows = truth[rid]
        if len(rows) == 1:
            single += 1
            good += _on_truth(chains, mine[0], rows[0], names, seeder.contig_offsets)
            confident += chains.mapq[mine[0]] >= 20
            continue
        if min(r[7] - r[6] for r in rows) < 800:
            continue
        n_chimeras += 1
        tops = [c for c in mine if chains.role[c] != SECONDARY]
        chimeras_split += all(any(_on_truth(chains, c, r, names, seeder.contig_offsets) for c in tops) for r in rows)
    assert good >= 0.97 * single
    assert confident >= 0.9 * single
    assert n_chimeras >= 5 and chimeras_split >= n_chimeras - 1


def test_chain_anchors_run_forward_on_both_sequences(genome, seeder):
    reads = simulate_reads(genome, 40, PROFILES["r9"], mean_length=3000, seed=9)
    seeds = seeder(reads.codes, reads.offsets)
    chains = chain(seeds, np.diff(reads.offsets), seeder.contig_offsets)
    for c in range(len(chains)):
        a = chains.anchors[chains.anchor_off[c]:chains.anchor_off[c + 1]]
        assert np.all(seeds.read[a] == chains.read[c]) and np.all(seeds.rc[a] == chains.rc[c])
        assert np.all(np.diff(seeds.qpos[a]) > 0) and np.all(np.diff(seeds.rpos[a]) > 0)
        assert chains.qstart[c] == seeds.qpos[a[0]] and chains.rend[c] == seeds.rpos[a[-1]] + seeds.length[a[-1]]
        assert chains.role[chains.parent[c]] != SECONDARY
        assert (chains.parent[c] == c) == (chains.role[c] != SECONDARY)


def test_exact_repeat_gives_mapq_zero_and_a_secondary(genome):
    contigs = [(n, c.copy()) for n, c in genome]
    contigs[1][1][100_000:130_000] = contigs[0][1][200_000:230_000]
    seeder = KmerSeeder.of(contigs, k=15)
    reads = simulate_reads([("dup", contigs[0][1][205_000:225_000])], 10, PROFILES["r10"], mean_length=4000,
                           chimeras=0, seed=3)
    chains = chain(seeder(reads.codes, reads.offsets), np.diff(reads.offsets), seeder.contig_offsets)
    for i in range(10):
        mine = np.flatnonzero(chains.read == i)
        assert chains.role[mine[0]] == PRIMARY and chains.mapq[mine[0]] <= 3
        assert SECONDARY in chains.role[mine]
        assert set(chains.contig[mine]) == {0, 1}


def _seeds(rows):
    read, qpos, rpos, length, rc = (np.array(x) for x in zip(*rows))
    order = np.lexsort((qpos, rpos - qpos, rc, read))
    return Seeds(read[order].astype(np.int32), qpos[order].astype(np.int32), rpos[order].astype(np.int64),
                 length[order].astype(np.int32), rc[order].astype(bool))


def test_dynamic_programme_rules():
    offsets = np.array([0, 10_000, 20_000])
    rows = [(0, 0, 1000, 30, False), (0, 100, 1100, 30, False), (0, 200, 1205, 30, False),  # colinear, small indel
            (0, 300, 5000, 20, False),  # off the diagonal: too far a gap difference to join
            (0, 400, 9_970, 25, False), (0, 450, 10_020, 25, False),  # matches on two contigs do not chain
            (1, 50, 3000, 25, True), (1, 150, 3100, 25, True), (1, 250, 3200, 25, True)]
    chains = chain(_seeds(rows), np.array([600, 400]), offsets, ChainParams(min_score=40, bandwidth=100))
    first = np.flatnonzero(chains.read == 0)[0]
    mean_length = (3 * 30 + 20 + 2 * 25) / 6
    assert chains.role[first] == PRIMARY and chains.score[first] == 90 - int(0.01 * mean_length * 5 + 0.5 * np.log2(5))
    assert (chains.qstart[first], chains.qend[first], chains.rstart[first], chains.rend[first]) == (0, 230, 1000, 1235)
    assert chains.contig[first] == 0
    assert not any((chains.read == 0) & (chains.rstart >= 9_970))
    second = np.flatnonzero(chains.read == 1)
    assert len(second) == 1 and chains.rc[second[0]] and chains.score[second[0]] == 75
    assert chains.role[second[0]] == PRIMARY and chains.mapq[second[0]] > 0


def test_no_seeds_no_chains():
    empty = Seeds(*(np.zeros(0, t) for t in (np.int32, np.int32, np.int64, np.int32, bool)))
    chains = chain(empty, np.array([100]), np.array([0, 1000]))
    assert len(chains) == 0 and list(chains.anchor_off) == [0]
