"""ABEA: f5c's emission statistic for read1, the slow reference on the fixture reads, alignment shape,
crafted reads, per-cell rules."""

from __future__ import annotations

import re

import numpy as np
import pytest

from streamer.pipeline.abea import AbeaParams, AbeaReads, align_batch, cell_score
from streamer.pipeline.abea_cells import FROM_D, FROM_L, FROM_U
from streamer.pipeline.scaling import estimate_scalings
from streamer.skips import Skip

import reference_abea
from conftest import ECOLI
from ecoli_reads import fixture_reads
from test_scaling import nuc_model, pack, read1  # noqa: F401  (nuc_model is a fixture)

RNG_SEED = 7


def run(batch, model, **kw):
    shift, scale, _ = estimate_scalings(*batch, model)
    return align_batch(AbeaReads(*batch, shift, scale), model, AbeaParams(**kw)), batch[-1]


def synthetic(model, n_bases, events_per_kmer=1, seed=RNG_SEED):
    """A read whose events sit exactly on the model level of each k-mer in turn."""
    rng = np.random.default_rng(seed)
    seq = "".join(rng.choice(list("ACGT"), n_bases))
    ranks = [int(seq[i : i + 6].translate(str.maketrans("ACGT", "0123")), 4) for i in range(n_bases - 5)]
    means = np.repeat(model.level_mean[ranks], events_per_kmer).astype(np.float32)
    return seq, means


def test_read1_emission_statistic_matches_f5c(nuc_model):
    seq, means = read1()
    aln, status = run(pack([seq], [means]), nuc_model)
    fields = dict(re.findall(r"(\w+) (-?[\d.]+)", (ECOLI / "adaptive.exp").read_text()))
    assert status[0] == Skip.OK
    assert aln.n_aligned[0] == float(fields["n_aligned_events"]) == 7206
    # f5c's arithmetic gives -20697.528036 against the recorded -20697.529925 (9e-8 relative);
    # the average agrees to all printed digits
    assert aln.sum_emission[0] == pytest.approx(float(fields["sum_emission"]), rel=1e-6)
    assert f"{aln.avg_log_emission[0]:.6f}" == fields["avg_log_emission"]


def assert_equals_reference(seqs, means, shift, scale, model, **kw):
    batch = pack(seqs, means)
    status = batch[-1]
    aln = align_batch(AbeaReads(*batch, shift, scale), model, AbeaParams(**kw))
    for i in range(len(seqs)):
        ref = reference_abea.align(seqs[i], means[i], shift[i], scale[i], model, **kw)
        a0, a1 = aln.aln_off[i], aln.aln_off[i + 1]
        assert list(zip(aln.aln_kmer[a0:a1].tolist(), aln.aln_event[a0:a1].tolist())) == ref.pairs
        assert (aln.sum_emission[i], aln.n_aligned[i]) == (ref.sum_emission, ref.n_aligned)
        assert (status[i] != Skip.OK, status[i] == Skip.OVERSEGMENTED) == (ref.failed, ref.oversegmented)
    return status


def test_fixture_reads_equal_the_slow_reference(nuc_model):
    seqs, means, shift, scale = fixture_reads(nuc_model)
    status = assert_equals_reference(seqs, means, shift, scale, nuc_model)
    assert (status == Skip.OK).sum() >= len(seqs) - 1


def test_reference_agrees_on_failures_and_other_settings(nuc_model):
    seqs, means, shift, scale = fixture_reads(nuc_model)
    # events of another read: fails the emission QC; a narrow band and a short skip limit
    wrong = assert_equals_reference(seqs[:1], means[1:2], shift[:1], scale[:1], nuc_model)
    assert wrong[0] == Skip.ALIGNMENT_FAILED
    assert_equals_reference(seqs[:2], means[:2], shift[:2], scale[:2], nuc_model, bandwidth=20, max_skip_run=3)
    # a band too narrow for most reads: passes and QC failures alike
    narrow = assert_equals_reference(seqs, means, shift, scale, nuc_model, bandwidth=6)
    assert Skip.OK in narrow and Skip.ALIGNMENT_FAILED in narrow


def test_read1_pairs_are_an_ascending_monotone_path(nuc_model):
    seq, means = read1()
    aln, _ = run(pack([seq], [means]), nuc_model)
    k, e = aln.aln_kmer, aln.aln_event
    assert aln.aln_off.tolist() == [0, 7206]
    assert k.dtype == np.int32 and e.dtype == np.int32
    assert k[0] == 0 and k[-1] == len(seq) - 6
    steps = set(zip(np.diff(k).tolist(), np.diff(e).tolist()))
    assert steps <= {(1, 1), (0, 1), (1, 0)}


def test_batch_is_deterministic_and_equals_single_reads(nuc_model):
    seq, means = read1()
    single, _ = run(pack([seq], [means]), nuc_model)
    batch = pack([seq, seq[:2000], seq], [means, means[:3900], means])
    batch[-1][1] = Skip.LOW_MAPQ
    aln, status = run(batch, nuc_model)
    again, _ = run(pack([seq, seq[:2000], seq], [means, means[:3900], means]), nuc_model)
    assert list(status) == [Skip.OK, Skip.LOW_MAPQ, Skip.OK]
    off = aln.aln_off
    assert off[2] - off[1] == 0
    for i in (0, 2):
        np.testing.assert_array_equal(aln.aln_kmer[off[i] : off[i + 1]], single.aln_kmer)
        np.testing.assert_array_equal(aln.aln_event[off[i] : off[i + 1]], single.aln_event)
        assert aln.sum_emission[i] == single.sum_emission[0]
    np.testing.assert_array_equal(again.aln_event[again.aln_off[2] :], single.aln_event)


def test_perfect_read_aligns_on_the_diagonal(nuc_model):
    seq, means = synthetic(nuc_model, 300)
    aln, status = run(pack([seq], [means]), nuc_model)
    assert status[0] == Skip.OK
    n = len(seq) - 5
    np.testing.assert_array_equal(aln.aln_kmer, np.arange(n))
    np.testing.assert_array_equal(aln.aln_event, np.arange(n))


def test_two_events_per_kmer_are_aligned_as_stays(nuc_model):
    seq, means = synthetic(nuc_model, 300, events_per_kmer=2)
    aln, status = run(pack([seq], [means]), nuc_model)
    assert status[0] == Skip.OK
    # every event once; an event may drift to a neighbouring k-mer whose Gaussian scores it
    # higher (a narrower stdv can outweigh a small level difference), but rarely
    np.testing.assert_array_equal(aln.aln_event, np.arange(len(means)))
    assert np.mean(aln.aln_kmer == aln.aln_event // 2) > 0.95


def test_oversegmented_read_is_flagged_not_aligned(nuc_model):
    seq, means = synthetic(nuc_model, 20)
    over = np.repeat(means, 20)  # 300 events for 20 bases: exactly 15 per base
    under = over[:299]
    aln, status = run(pack([seq, seq], [over, under]), nuc_model)
    assert status[0] == Skip.OVERSEGMENTED
    assert status[1] != Skip.OVERSEGMENTED
    assert aln.aln_off[1] == 0 and aln.n_aligned[0] == 0


def test_poor_emissions_fail_the_read_but_keep_the_statistic(nuc_model):
    seq, means = synthetic(nuc_model, 300)
    batch = pack([seq], [means])
    shift = np.array([40.0], np.float32)
    scale = np.ones(1, np.float32)
    aln = align_batch(AbeaReads(*batch, shift, scale), nuc_model)
    assert batch[-1][0] == Skip.ALIGNMENT_FAILED
    assert aln.aln_off[-1] == 0
    assert aln.avg_log_emission[0] < -5.0


def test_skip_run_threshold_is_an_argument(nuc_model):
    seq, means = synthetic(nuc_model, 300)
    gapped = np.concatenate([means[:100], means[105:]])  # k-mers 100-104 have no events
    aln, status = run(pack([seq], [gapped]), nuc_model)
    assert status[0] == Skip.OK
    assert np.max(np.diff(aln.aln_kmer)) == 1 and len(aln.aln_kmer) == len(gapped) + 5
    _, status = run(pack([seq], [gapped]), nuc_model, max_skip_run=4)
    assert status[0] == Skip.ALIGNMENT_FAILED


def test_cell_rules():
    f = np.float32
    lp_half, lp_skip = np.log(0.5), np.log(1e-10)
    assert cell_score(f(-1), f(-9), f(-9), f(-2), lp_half, lp_half, lp_skip)[1] == FROM_D
    # equal diagonal and up scores: up wins
    assert cell_score(f(-1), f(-1), f(-99), f(-2), lp_half, lp_half, lp_skip)[1] == FROM_U
    # left ties with the best: left wins
    assert cell_score(f(-3), f(-99), f(-3), f(0), lp_skip, lp_half, lp_skip)[1] == FROM_L
    # unreachable cell: -inf, marked left as f5c's comparisons leave it
    score, move = cell_score(*(f(-np.inf),) * 3, f(-2), lp_half, lp_half, lp_skip)
    assert score == -np.inf and move == FROM_L
    # scores are formed in double and rounded once to float32
    diag, em = f(-1234.5678), f(-2.3456789)
    score, _ = cell_score(diag, f(-np.inf), f(-np.inf), em, lp_half, lp_half, lp_skip)
    assert score == f(np.float64(diag) + lp_half + np.float64(em))
