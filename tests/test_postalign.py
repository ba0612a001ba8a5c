"""Recalibration and QC: read1 and whole data sets against f5c 1.1, crafted alignments."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamer.pipeline.abea import AbeaReads, align_batch
from streamer.pipeline.events import detect_events
from streamer.io.fast5 import iter_fast5
from streamer.io.fastx import load_basecalls
from streamer.pipeline.postalign import PostalignParams, PostalignReads, m_events, recalibrate_batch
from streamer.pore.model import kmer_rank
from streamer.pipeline.scaling import F5C_CODES, estimate_scalings
from streamer.skips import Skip

from conftest import ECOLI, READ1, SHARED, needs_shared
from test_abea import synthetic
from test_scaling import nuc_model, pack, read1  # noqa: F401  (nuc_model is a fixture)


def expected_scalings(path: Path) -> dict[str, tuple[float, float, float]]:
    """read -> (shift, scale, var) from a recalibrated_scalings.tsv (one row per BAM record)."""
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:] if line]
    return {r[0]: (float(r[1]), float(r[2]), float(r[3])) for r in rows}


def diagonal(n_kmers: int, per_kmer: int = 1):
    """Pairs of an alignment giving each k-mer `per_kmer` consecutive events."""
    kmer = np.repeat(np.arange(n_kmers, dtype=np.int32), per_kmer)
    event = np.arange(n_kmers * per_kmer, dtype=np.int32)
    return kmer, event, np.array([0, len(kmer)], dtype=np.int64)


def recalibrate(batch, pairs, model, shift=0.0, scale=1.0, **kw):
    n = len(batch[1]) - 1
    s = np.full(n, shift, np.float32)
    c = np.full(n, scale, np.float32)
    return recalibrate_batch(PostalignReads(*batch[:4], *pairs, batch[4], s, c, np.ones(n, np.float32)), model,
                             PostalignParams(**kw))


def test_read1_matches_f5c(nuc_model):
    seq, means = read1()
    batch = pack([seq], [means])
    shift, scale, var = estimate_scalings(*batch, nuc_model)
    aln = align_batch(AbeaReads(*batch, shift, scale), nuc_model)
    out = recalibrate_batch(PostalignReads(*batch[:4], aln.aln_kmer, aln.aln_event, aln.aln_off, batch[4], shift, scale, var),
                            nuc_model)
    assert batch[4][0] == Skip.OK
    expected = expected_scalings(ECOLI / "recalibrated_scalings.tsv")[READ1]
    got = (out.shift[0], out.scale[0], out.var[0])
    assert got == pytest.approx(expected, abs=0.01)
    assert [f"{x:.2f}" for x in got] == [f"{x:.2f}" for x in expected]
    assert out.shift.dtype == out.scale.dtype == out.var.dtype == np.float32
    assert 1.0 < out.events_per_base[0] < 3.0


def test_known_scalings_are_recovered(nuc_model):
    seq, levels = synthetic(nuc_model, 400)
    means = (np.float32(1.1) * levels + np.float32(-7.5)).astype(np.float32)
    batch = pack([seq], [means])
    out = recalibrate(batch, diagonal(len(levels)), nuc_model)
    assert batch[4][0] == Skip.OK
    assert out.shift[0] == pytest.approx(-7.5, abs=1e-3)
    assert out.scale[0] == pytest.approx(1.1, abs=1e-5)
    assert out.var[0] < 1e-3
    assert out.events_per_base[0] == (len(levels) - 1) / len(levels)


def test_too_few_state_changes_fail_recalibration(nuc_model):
    seq, levels = synthetic(nuc_model, 150)  # 145 k-mers: fewer than 200 M events
    batch = pack([seq], [levels])
    out = recalibrate(batch, diagonal(len(levels)), nuc_model, shift=1.5)
    assert batch[4][0] == Skip.RECALIBRATION_FAILED
    assert out.shift[0] == np.float32(1.5)  # left as estimated
    batch = pack([seq], [levels])
    recalibrate(batch, diagonal(len(levels)), nuc_model, min_events=100)
    assert batch[4][0] == Skip.OK


def test_repeated_kmer_rank_is_not_a_new_state(nuc_model):
    # 250 k-mers, all AAAAAA: the rank never changes, so only the first event is an M event
    seq = "A" * 255
    level = nuc_model.level_mean[0]
    batch = pack([seq], [np.full(250, level, np.float32)])
    recalibrate(batch, diagonal(250), nuc_model)
    assert batch[4][0] == Skip.RECALIBRATION_FAILED


def test_noisy_read_fails_on_var(nuc_model):
    seq, levels = synthetic(nuc_model, 400)
    rng = np.random.default_rng(3)
    stdv = nuc_model.level_stdv[[int(seq[i : i + 6].translate(str.maketrans("ACGT", "0123")), 4) for i in range(395)]]
    noisy = (levels + 4 * stdv * rng.standard_normal(len(levels))).astype(np.float32)
    batch = pack([seq, seq], [noisy, noisy])
    kmer, event, _ = diagonal(len(levels))
    pairs = (np.tile(kmer, 2), np.tile(event, 2), np.array([0, len(kmer), 2 * len(kmer)], np.int64))
    out = recalibrate(batch, pairs, nuc_model)
    assert list(batch[4]) == [Skip.RECALIBRATION_FAILED] * 2
    assert out.var[0] > 2.5  # written even though the read fails, as f5c leaves it


def test_events_per_base_qc(nuc_model):
    seq, levels = synthetic(nuc_model, 400)
    six = np.repeat(levels, 6)  # 6 events per k-mer: span 2369 events over 395 k-mers
    batch = pack([seq], [six])
    out = recalibrate(batch, diagonal(len(levels), 6), nuc_model)
    assert out.events_per_base[0] == (len(six) - 1) / len(levels)
    assert batch[4][0] == Skip.QC_FAILED
    batch = pack([seq], [six])
    recalibrate(batch, diagonal(len(levels), 6), nuc_model, max_events_per_base=6.5)
    assert batch[4][0] == Skip.OK


def test_base_to_event_map(nuc_model):
    seq, levels = synthetic(nuc_model, 400)
    # k-mer 1 skipped (event 1 pairs with k-mers 0 and 1), k-mer 3 holds events 3-5
    kmer = np.array([0, 1, 2, 3, 3, 3, 4], np.int32)
    event = np.array([1, 1, 2, 3, 4, 5, 6], np.int32)
    batch = pack([seq, seq], [levels, levels])
    batch[4][0] = Skip.ALIGNMENT_FAILED
    pairs = (np.tile(kmer, 2), np.tile(event, 2), np.array([0, 0, 7], np.int64))
    out = recalibrate(batch, pairs, nuc_model)
    lo, hi = out.kmer_off[1], out.kmer_off[2]
    assert out.kmer_off.tolist() == [0, 395, 790]
    assert out.b2e_start[lo : lo + 6].tolist() == [1, -1, 2, 3, 6, -1]
    assert out.b2e_stop[lo : lo + 6].tolist() == [1, -1, 2, 5, 6, -1]
    assert out.events_per_base[1] == 5 / 395
    assert (out.b2e_start[:lo] == -1).all() and out.events_per_base[0] == 0


def run_signal_pipeline(fast5_dir: Path, reads_fasta: Path, model):
    """events -> scaling -> ABEA -> recalibration for every read with basecalls."""
    records = [r for path in sorted(fast5_dir.glob("*.fast5")) for r in iter_fast5(path)]
    calls = load_basecalls(reads_fasta, {r.read_id for r in records})
    records = [r for r in records if r.read_id in calls]
    signals = [r.to_pa() for r in records]
    signal_off = np.zeros(len(signals) + 1, np.int64)
    np.cumsum([len(s) for s in signals], out=signal_off[1:])
    ev_off, _, _, ev_mean, _ = detect_events(np.concatenate(signals), signal_off)
    seqs = [calls[r.read_id] for r in records]
    seq, seq_off, _, _, status = pack(seqs, [])
    batch = (seq, seq_off, ev_mean, ev_off, status)
    shift, scale, var = estimate_scalings(*batch, model)
    aln = align_batch(AbeaReads(*batch, shift, scale), model)
    out = recalibrate_batch(PostalignReads(*batch[:4], aln.aln_kmer, aln.aln_event, aln.aln_off, status, shift, scale, var),
                            model)
    return [r.read_id for r in records], status, out


def check_against_f5c(ids, status, out, expected):
    listed = [i for i, rid in enumerate(ids) if rid in expected]
    assert {ids[i] for i in listed} == set(expected)
    for i in listed:
        assert status[i] == Skip.OK, ids[i]
        got = (out.shift[i], out.scale[i], out.var[i])
        assert got == pytest.approx(expected[ids[i]], abs=0.01), ids[i]


def test_fixture_reads_match_f5c(nuc_model):
    ids, status, out = run_signal_pipeline(ECOLI / "fast5", ECOLI / "reads.fasta", nuc_model)
    check_against_f5c(ids, status, out, expected_scalings(ECOLI / "recalibrated_scalings.tsv"))


@needs_shared
def test_2kb_region_reads_match_f5c(nuc_model):
    ids, status, out = run_signal_pipeline(SHARED / "fast5_files", SHARED / "reads.fasta", nuc_model)
    expected = expected_scalings(SHARED / "expected" / "f5c-1.1-read-level" / "recalibrated_scalings.tsv")
    check_against_f5c(ids, status, out, expected)


@pytest.mark.parametrize("k", [5, 6, 9])
def test_m_events_roll_the_ranks_kmer_rank_gives(k):
    """The M events' rolling ranks are `kmer_rank`'s, -1 included for a k-mer with a letter outside the table."""
    rng = np.random.default_rng(k)
    seq = rng.choice(np.frombuffer(b"ACGTN", np.uint8), 300, p=[0.24, 0.24, 0.24, 0.24, 0.04])
    n_kmers = len(seq) - k + 1
    b2e_start = np.where(rng.random(n_kmers) < 0.9, np.arange(n_kmers), -1).astype(np.int32)
    for codes in (F5C_CODES, np.where(np.arange(256) == ord("N"), -1, F5C_CODES).astype(np.int8)):
        m_rank, m_event = np.empty(n_kmers, np.int32), np.empty(n_kmers, np.int32)
        n_m = m_events(seq, 0, k, codes, b2e_start, 0, n_kmers, m_rank, m_event)
        want, prev = [], -1
        for j in np.flatnonzero(b2e_start != -1):
            r = kmer_rank(seq, j, k, codes, 4)
            if r != prev:
                want.append((r, b2e_start[j]))
            prev = r
        assert list(zip(m_rank[:n_m].tolist(), m_event[:n_m].tolist())) == want
    assert -1 in m_rank[:n_m]  # the table with N outside it gave some
