"""The CpG profile HMM with a 9-mer model (R10.4.1's k): bit for bit the slow reference, windows in
parallel equal to single windows, and the methylated hypothesis winning on methylated events."""

from __future__ import annotations

import numpy as np
import pytest

import reference_hmm
from cpg_model9 import cpg_model, events_for, synthetic_jobs
from streamer_plugins.cpg.hmm import (
    HmmParams,
    block_transitions,
    pack_model,
    pack_scalings,
    profile_forward,
    score_windows,
)
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
            got = profile_forward(seq, 2, len(WINDOW), rc, methylated, events, e_start, e_stop, K, model, scalings,
                                  trans, params, LOGSUM_TABLE)  # fmt: skip
            args = (WINDOW, events, e_start, e_stop, rc, methylated, meth9.level_mean, meth9.level_stdv, scale, shift,
                    var, epb)  # fmt: skip
            assert got == reference_hmm.forward(*args, k=K)
            ll[methylated] = got
        assert (ll[True] > ll[False]) == truth  # the hypothesis the events were drawn from wins


def test_parallel_k9_jobs_equal_single_windows(meth9):
    args = synthetic_jobs(meth9, np.random.default_rng(4))
    job_read, w0, w1, e1, e2, ref, ref_off, rc, ev, ev_off, scalings, epb, k, model, params, table = args
    ll_u, ll_m = score_windows(*args)
    for i in range(len(job_read)):
        r = job_read[i]
        trans = block_transitions(epb[r], params)
        events = ev[ev_off[r] : ev_off[r + 1]]
        for meth_flag, out in ((False, ll_u), (True, ll_m)):
            one = profile_forward(ref, ref_off[r] + w0[i], w1[i] - w0[i], rc[r], meth_flag, events, e1[i], e2[i], k,
                                  model, scalings[r], trans, params, table)  # fmt: skip
            assert out[i] == one and np.isfinite(one)
