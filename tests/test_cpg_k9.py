"""The CpG profile HMM with a 9-mer model (R10.4.1's k): bit for bit the slow reference, windows in
parallel equal to single windows, the methylated hypothesis winning on methylated events, and the
windows, their events and their sequence planned for 9-mers."""

from __future__ import annotations

import numpy as np
import pytest

import reference_hmm
from cpg_model9 import cpg_model, events_for, nucleotide_model, synthetic_jobs
from streamer.pipeline.batch import CIGAR_M
from streamer_plugins.cpg.calls import call_methylation
from test_cpg import CPG_MOTIF, cig, make_batch, random_ref
from streamer_plugins.cpg.hmm import profile_forward, score_windows
from streamer_plugins.cpg.hmm_model import HmmParams, block_transitions, pack_model, pack_scalings
from streamer_plugins.cpg.logsum import LOGSUM_TABLE

K = 9
WINDOW = "GATTACGCTTGCGATCAGTCGGATTCGAAGT"  # three CpGs, two of them 9 bases apart


@pytest.fixture(scope="module")
def meth9():
    return cpg_model(K)


def ascii_(s: str) -> np.ndarray:
    return np.frombuffer(s.encode(), dtype=np.uint8)


def test_model_shifts_methylated_levels_by_the_known_amount(meth9):
    assert meth9.k == K and len(meth9.level_mean) == 5**K
    c, m = reference_hmm.rank("AACGTTACG"), reference_hmm.rank("AAMGTTAMG")
    assert np.isclose(meth9.level_mean[m] - meth9.level_mean[c], np.linspace(-3.0, 4.0, K)[[2, 7]].sum(), atol=1e-4)


@pytest.mark.parametrize("rc", [False, True])
def test_forward_k9_equals_slow_reference(meth9, rc):
    rng = np.random.default_rng(19 if rc else 9)
    model = pack_model(meth9.level_mean, meth9.level_stdv)
    scale, shift, var, epb = 1.05, -2.0, 1.2, 1.8
    scalings = pack_scalings(np.array([scale]), np.array([shift]), np.array([var]))[0]
    params = HmmParams().as_array()
    trans = block_transitions(epb, params)
    seq = ascii_("TT" + WINDOW + "AA")
    for truth in (False, True):
        events = events_for(meth9, WINDOW, rc, truth, rng)
        n = len(events)
        e_start, e_stop = (n - 2, 1) if rc else (1, n - 2)
        ll = {}
        for methylated in (False, True):
            got = profile_forward(seq, 2, len(WINDOW), rc, methylated, *CPG_MOTIF, events, e_start, e_stop, K, model,
                                  scalings, False, trans, params, LOGSUM_TABLE)  # fmt: skip
            args = (WINDOW, events, e_start, e_stop, rc, methylated, meth9.level_mean, meth9.level_stdv, scale, shift,
                    var, epb)  # fmt: skip
            assert got == reference_hmm.forward(*args, k=K)
            ll[methylated] = got
        assert (ll[True] > ll[False]) == truth  # the hypothesis the events were drawn from wins


def test_parallel_k9_jobs_equal_single_windows(meth9):
    args = synthetic_jobs(meth9, np.random.default_rng(4))
    job_read, w0, w1, e1, e2, ref, ref_off, rc, ev, ev_off, scalings, epb, k, model, sites, marks, params, table, _ = (
        args)
    ll_u, ll_m = score_windows(*args)
    for i in range(len(job_read)):
        r = job_read[i]
        trans = block_transitions(epb[r], params)
        events = ev[ev_off[r] : ev_off[r + 1]]
        for meth_flag, out in ((False, ll_u), (True, ll_m)):
            one = profile_forward(ref, ref_off[r] + w0[i], w1[i] - w0[i], rc[r], meth_flag, sites, marks, events, e1[i],
                                  e2[i], k, model, scalings[r], False, trans, params, table)  # fmt: skip
            assert out[i] == one and np.isfinite(one)


def test_call_methylation_plans_9mer_windows(meth9):
    rng = np.random.default_rng(4)
    fwd = random_ref(rng, 200, [50, 57, 120])
    rev = random_ref(rng, 200, [80])
    specs = [("fwd", fwd, False, cig((CIGAR_M, 200))), ("rev", rev, True, cig((CIGAR_M, 200)))]
    models = (nucleotide_model(K), meth9)
    b = make_batch(models, specs, rng)  # two events per read k-mer, from the methylated model
    calls = call_methylation(b, *models)
    assert calls.read.tolist() == [0, 0, 1]
    assert calls.start.tolist() == [5050, 5120, 5080] and calls.end.tolist() == [5057, 5120, 5080]
    assert calls.strand.tolist() == [1, 1, -1]
    # k - 1 before the first C to k after the last
    assert calls.sequence.tolist() == [fwd[42:66], fwd[112:129], rev[72:89]]
    assert np.all(calls.llr > 0)
    epb = (2 * 192 - 1) / 192  # (last event - first event) / 9-mers
    # the first group's window [40, 67] on k-mers 2i -> events 2i: events 80..134
    want = reference_hmm.forward(fwd[40:68], b.ev_mean[: b.ev_off[1]], 80, 134, False, True, meth9.level_mean,
                                 meth9.level_stdv, 1.0, 0.0, 1.0, epb, k=K)  # fmt: skip
    assert calls.ll_meth[0] == want
    # reverse strand: window [70, 90], read k-mer of reference base p is 200 - p - 9
    want = reference_hmm.forward(rev[70:91], b.ev_mean[b.ev_off[1] : b.ev_off[2]], 2 * 121, 2 * 101, True, False,
                                 meth9.level_mean, meth9.level_stdv, 1.0, 0.0, 1.0, epb, k=K)  # fmt: skip
    assert calls.ll_unmeth[2] == want
