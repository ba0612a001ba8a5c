"""CpG calling pieces: log-sum, CIGAR lookup, site grouping, the profile HMM and batch calls."""

import math

import numpy as np
import pytest

import reference_hmm
from streamer.io.signal_record import SignalRecord
from streamer.pipeline.batch import CIGAR_D, CIGAR_H, CIGAR_I, CIGAR_M, CIGAR_N, CIGAR_S, ReadInput, pack
from streamer_plugins.cpg.calls import CALLS_HEADER, call_methylation, format_calls
from streamer_plugins.cpg.hmm import profile_forward, score_windows, window_kmer_rank
from streamer_plugins.cpg.hmm_model import HmmParams, block_transitions, pack_model, pack_scalings
from streamer_plugins.cpg.logsum import LOGSUM_TABLE, flogsum
from streamer_plugins.cpg.lookup import (aligned_blocks, aligned_segments, base_event, closest_event, events_bounding,
                                         is_spliced, map_span)
from streamer.pipeline.postalign import event_map
from streamer_plugins.cpg.sites import (DISAMBIGUATE, batch_sites, disambiguated, group_sites, group_slots, motif_sites,
                                       read_windows)
from streamer.pore.model import load_default_models
from streamer.pore.motifs import CPG, MOTIFS
from streamer.skips import Skip

F32 = np.float32
CPG_MOTIF = (CPG.table(), CPG.marks())  # the kernels' `sites` and `marks` for CpG


@pytest.fixture(scope="module")
def models():
    return load_default_models()


def ascii_(s: str) -> np.ndarray:
    return np.frombuffer(s.encode(), dtype=np.uint8)


def cig(*ops):
    return np.array(ops, dtype=np.int32).reshape(-1, 2)


# ---------------------------------------------------------------- log-sum


def test_logsum_table_and_cutoffs():
    assert LOGSUM_TABLE.dtype == np.float32 and LOGSUM_TABLE.shape == (16000,)
    assert LOGSUM_TABLE[0] == F32(math.log(2.0))
    ninf = F32(-np.inf)
    assert flogsum(ninf, F32(-3.5), LOGSUM_TABLE) == F32(-3.5)
    assert flogsum(ninf, ninf, LOGSUM_TABLE) == ninf
    assert flogsum(F32(0.0), F32(-15.7), LOGSUM_TABLE) == F32(0.0)  # at the cutoff: just the max
    assert flogsum(F32(0.0), F32(-15.6), LOGSUM_TABLE) > F32(0.0)


def test_logsum_agrees_with_logaddexp_within_table_precision():
    rng = np.random.default_rng(7)
    a = rng.uniform(-300, 5, 2000).astype(np.float32)
    b = (a - rng.exponential(3.0, 2000)).astype(np.float32)
    got = np.array([flogsum(x, y, LOGSUM_TABLE) for x, y in zip(a, b)])
    want = np.logaddexp(a.astype(np.float64), b.astype(np.float64))
    # the table index truncates to 0.001 nat, where the slope of log(1 + e^-d) is at most 1/2
    assert np.max(np.abs(got - want)) < 5.5e-4
    assert np.all(np.array([flogsum(y, x, LOGSUM_TABLE) for x, y in zip(a, b)]) == got)


# ---------------------------------------------------------------- CIGAR lookup


def test_aligned_blocks_walk_soft_clips_insertions_deletions_hard_clips():
    c = cig((CIGAR_H, 5), (CIGAR_S, 2), (CIGAR_M, 3), (CIGAR_I, 2), (CIGAR_M, 2), (CIGAR_D, 3), (CIGAR_M, 2), (CIGAR_S, 1))
    ref, read, first, segments = aligned_blocks(c, 100)
    assert ref.tolist() == [100, 103, 108] and first.tolist() == [0, 3, 5, 7]
    assert read.tolist() == [2, 7, 9]  # hard clips do not count, soft clips do
    assert segments.tolist() == [0, 3]
    assert not is_spliced(c)
    spliced = cig((CIGAR_M, 3), (CIGAR_N, 100), (CIGAR_M, 3), (CIGAR_D, 2), (CIGAR_M, 1))
    assert is_spliced(spliced)
    ref, _, first, segments = aligned_blocks(spliced, 0)
    assert ref.tolist() == [0, 103, 108] and segments.tolist() == [0, 1, 3]
    ref_pos, read_pos, seg_off = aligned_segments(spliced, 0)
    assert ref_pos.tolist() == [0, 1, 2, 103, 104, 105, 108] and read_pos.tolist() == list(range(7))
    assert seg_off.tolist() == [0, 3, 7]  # the N starts the second segment


def aligned_pairs(cigar, ref_start):
    """(reference, read) position of every aligned base, walked base by base: what the runs stand for."""
    ref, read, first, _ = aligned_blocks(cigar, ref_start)
    runs = [(r + i, q + i) for r, q, n in zip(ref, read, np.diff(first)) for i in range(n)]
    return [r for r, _ in runs], [q for _, q in runs]


def nanopolish_map(cigar, ref_start, rc, read_len, k, first_event, search=1000):
    """The event-to-reference map as nanopolish and f5c make it, base by base: every aligned base at
    least k from either read end, with the closest event of its k-mer; empty when its first and last
    events are the same."""
    pairs = [(r, closest_event(first_event, read_len - q - k if rc else q, search))
             for r, q in zip(*aligned_pairs(cigar, ref_start)) if k <= q and q + k < read_len]  # fmt: skip
    return [] if pairs and pairs[0][1] == pairs[-1][1] else pairs


def lookup_map(cigar, ref_start, rc, read_len, k, first_event, search=1000):
    """The map `map_span` describes, entry by entry."""
    ref, read, first, _ = aligned_blocks(cigar, ref_start)
    lo, hi, _, _ = map_span(ref, read, first, rc, read_len, k, first_event, search)
    out = []
    for a in range(lo, hi):
        b = int(np.searchsorted(first, a, side="right") - 1)
        out.append((int(ref[b] + a - first[b]), base_event(read, first, b, a, rc, read_len, k, first_event, search)))
    return out


def bounding(cigar, ref_start, rc, read_len, k, first_event, ref_first, ref_last, search=1000):
    ref, read, first, _ = aligned_blocks(cigar, ref_start)
    lo, hi, b_lo, ref_lo = map_span(ref, read, first, rc, read_len, k, first_event, search)
    return events_bounding(ref, read, first, lo, hi, b_lo, ref_lo, ref_first, ref_last, b_lo, b_lo, rc, read_len, k,
                           first_event, search)[:3]  # fmt: skip


def test_kmer_first_event_ignores_a_repeated_event():
    # k-mer 1 is skipped (it repeats event 1), k-mer 2 gets events 2 and 3, k-mer 3 none
    first = event_map(np.array([0, 8]), np.array([0, 0, 1, 2, 2, 4], np.int32), np.array([0, 1, 1, 2, 3, 4], np.int32),
                      np.array([0, 6]), 3).b2e_start  # fmt: skip
    assert first.tolist() == [0, -1, 2, -1, 4, -1]


def test_closest_event_looks_back_first_and_never_reaches_the_limit():
    first = np.array([-1, 5, -1, -1, 9, -1, -1])
    assert closest_event(first, 3, 1000) == 5  # back to k-mer 1 before forward to k-mer 4
    assert closest_event(first, 0, 1000) == 5  # nothing behind k-mer 0: forward
    assert closest_event(first, 3, 1) == -1  # k-mers 2 and 4 are the limits, never examined
    assert closest_event(first, 4, 1) == 9
    assert closest_event(np.array([-1, -1, -1, 7]), 1, 1000) == -1  # the last k-mer is a limit too


def identity_events(n_kmers):
    """k-mer i aligned to events 2i and 2i + 1."""
    return np.arange(n_kmers) * 2


def test_event_map_forward_strand():
    k, read_len = 3, 20
    c = cig((CIGAR_S, 2), (CIGAR_M, 6), (CIGAR_D, 2), (CIGAR_I, 1), (CIGAR_M, 11))
    pairs = lookup_map(c, 50, False, read_len, k, identity_events(read_len - k + 1))
    # read positions 2..7 -> ref 50..55, then 9..19 -> ref 58..68; keep k <= pos < read_len - k
    assert pairs == [(51, 6), (52, 8), (53, 10), (54, 12), (55, 14)] + [(58 + i, 2 * (9 + i)) for i in range(8)]


def test_event_map_reverse_strand_flips_kmer_index():
    k, read_len = 3, 20
    pairs = lookup_map(cig((CIGAR_M, 20)), 0, True, read_len, k, identity_events(read_len - k + 1))
    assert [r for r, _ in pairs] == list(range(3, 17))
    assert [e for _, e in pairs] == [2 * (read_len - q - k) for q in range(3, 17)]  # descending events


def test_event_map_degenerate_is_empty():
    first = np.full(18, -1)
    first[0] = 4
    assert lookup_map(cig((CIGAR_M, 20)), 0, False, 20, 3, first) == []


def test_events_bounding():
    # map entries at reference 10, 11, 14, 15, 20 with events 1..5 (k = 1: read positions 1..5)
    c = cig((CIGAR_S, 1), (CIGAR_M, 2), (CIGAR_D, 2), (CIGAR_M, 2), (CIGAR_D, 4), (CIGAR_M, 1), (CIGAR_S, 1))
    args = (c, 10, False, 7, 1, np.arange(7))
    assert lookup_map(*args) == [(10, 1), (11, 2), (14, 3), (15, 4), (20, 5)]
    assert bounding(*args, 11, 15) == (True, 2, 4)
    assert bounding(*args, 12, 16) == (True, 3, 5)  # inner start is covered by 11
    assert bounding(*args, 10, 20) == (True, 1, 5)
    assert bounding(*args, 9, 15)[0] is False  # nothing at or before the start
    assert bounding(*args, 11, 21)[0] is False  # nothing at or after the end
    assert bounding(c, 10, False, 7, 1, np.zeros(7, np.int64), 11, 15)[0] is False  # a degenerate map


def random_alignment(rng):
    """A CIGAR of runs, indels and clips (none of N), its read length and a first event per k-mer with gaps."""
    ops = [(CIGAR_S, int(rng.integers(0, 4)))]
    for _ in range(int(rng.integers(1, 12))):
        ops.append((int(rng.choice([CIGAR_M, CIGAR_M, CIGAR_D, CIGAR_I])), int(rng.integers(0, 9))))
    ops.append((CIGAR_S, int(rng.integers(0, 4))))
    c = cig(*ops)
    read_len = int(sum(n for op, n in ops if op in (CIGAR_M, CIGAR_I, CIGAR_S)))
    k = int(rng.integers(1, 4))
    events = np.sort(rng.integers(0, 3 * read_len + 2, max(read_len - k + 1, 1)))
    events[rng.random(events.shape[0]) < 0.3] = -1
    return c, read_len, k, events


def test_the_runs_lookup_is_the_base_by_base_map_on_random_alignments():
    rng = np.random.default_rng(11)
    for _ in range(400):
        c, read_len, k, events = random_alignment(rng)
        rc = bool(rng.integers(0, 2))
        search = int(rng.choice([2, 1000]))
        want = nanopolish_map(c, 100, rc, read_len, k, events, search)
        assert lookup_map(c, 100, rc, read_len, k, events, search) == want
        ref = [r for r, _ in want]
        for v1 in range(95, 100 + read_len + 30, 3):
            for v2 in (v1, v1 + 1, v1 + 7):
                i = int(np.searchsorted(ref, v1))
                j = int(np.searchsorted(ref, v2))
                ok = i < len(ref) and j < len(ref) and (ref[i] == v1 or i > 0)
                expected = (True, want[i][1], want[j][1]) if ok else (False, -1, -1)
                assert bounding(c, 100, rc, read_len, k, events, v1, v2, search) == expected


# ---------------------------------------------------------------- CpG sites


def test_sites_and_groups():
    assert motif_sites(ascii_("ACGTTCGCGA"), 0, CPG.table()).tolist() == [1, 5, 7]
    assert motif_sites(ascii_("C"), 0, CPG.table()).tolist() == []
    assert motif_sites(ascii_("AC"), ord("G"), CPG.table()).tolist() == [1]  # ending on the base after the span
    sites = np.array([20, 30, 41, 300])
    first, end = group_sites(sites, 10)
    assert list(zip(first.tolist(), end.tolist())) == [(0, 2), (2, 3), (3, 4)]  # 10 apart merge, 11 do not


def test_a_batch_s_sites_are_each_read_s_whatever_its_motif():
    """`batch_sites`, which a GPU box's front thread runs ahead of ABEA, finds read by read what `motif_sites`
    finds, on the disambiguated reference and with the base after each span (none where 0)."""
    rng = np.random.default_rng(3)
    spans = rng.integers(0, 400, 40)
    off = np.concatenate([[0], np.cumsum(spans)])
    ref_seq = np.frombuffer(b"ACGTNRYacgt", np.uint8)[rng.integers(0, 11, off[-1])]
    after = np.frombuffer(b"\x00AGCgN", np.uint8)[rng.integers(0, 6, len(spans))]
    for motif in MOTIFS.values():
        table = motif.table()
        found = batch_sites(ref_seq, off, after, table)
        assert np.array_equal(found.ref, DISAMBIGUATE[ref_seq]) and found.off[-1] == len(found.at)
        for i in range(len(spans)):
            here = motif_sites(DISAMBIGUATE[ref_seq[off[i]:off[i + 1]]], DISAMBIGUATE[after[i]] if after[i] else 0,
                               table)  # fmt: skip
            assert found.at[found.off[i]:found.off[i + 1]].tolist() == here.tolist()
        assert len(found.at) > 0


def test_disambiguation_makes_iupac_cpgs():
    seq = DISAMBIGUATE[ascii_("sgNTYgRcgk")].tobytes().decode()
    assert seq == "CGATCGACGG"
    every = np.arange(256, dtype=np.uint8)
    assert np.array_equal(disambiguated(every), DISAMBIGUATE[every])  # the kernel the caller uses


def place_cpgs(length, positions):
    s = np.full(length, ord("A"), np.uint8)
    for p in positions:
        s[p], s[p + 1] = ord("C"), ord("G")
    return s


def test_a_span_holds_no_more_groups_than_its_slots():
    rng = np.random.default_rng(7)
    for span in (1, 2, 11, 12, 23, 500):
        for _ in range(50):  # the densest groups: sites every 11 bases, 11 = min_separation + 1
            sites = np.unique(rng.integers(0, span, rng.integers(1, span + 1)))
            assert len(group_sites(sites, 10)[0]) <= group_slots(np.array([span]), 10)[0]
        assert len(group_sites(np.arange(0, span, 11), 10)[0]) == group_slots(np.array([span]), 10)[0]
    assert group_slots(np.array([0]), 10)[0] == 0


def straight_read(n, events):
    """A CIGAR, read length and first events whose map (k = 1) has entries at reference 1000 + i with event
    events[i], for i < n: one soft-clipped base each side."""
    return cig((CIGAR_S, 1), (CIGAR_M, n), (CIGAR_S, 1)), n + 2, np.concatenate([[-1], events, [-1]])


def windows(sites, n, events, min_event_span=10):
    c, read_len, first_event = straight_read(n, events)
    return read_windows(sites, c, 1000, False, read_len, 1, first_event, 1000, 10, 200, min_event_span)


def test_read_windows_applies_every_rule():
    # 20: too close to the start; 40 and 50 merge; 100, 110, ..., 300 span 200 (kept);
    # 400, 410, ..., 590, 599, 601 span 201 (dropped); 700 alone
    chain = list(range(100, 301, 10))
    ref = place_cpgs(800, [20, 40, 50, *chain, *range(400, 591, 10), 599, 601, 700])
    sites = CPG.table()
    at = motif_sites(ref, 0, sites)
    first, last, n_sites, e1, e2 = windows(at, 800, np.arange(800) * 2)
    assert first.tolist() == [40, 100, 700]
    assert last.tolist() == [50, 300, 700]
    assert n_sites.tolist() == [2, len(chain), 1]
    assert e1.tolist() == [60, 180, 1380] and e2.tolist() == [120, 620, 1420]
    at = motif_sites(place_cpgs(800, [21, 700]), 0, sites)
    assert windows(at, 800, np.arange(800))[0].tolist() == [21, 700]
    # events too close together: a window of 21 bases over 21 // 3 events is not scored
    assert windows(at, 800, np.arange(800) // 3)[0].tolist() == []
    assert windows(at, 800, np.arange(800) // 3, min_event_span=5)[0].tolist() == [21, 700]
    # the map must reach past the window end
    assert windows(at, 710, np.arange(710))[0].tolist() == [21]


# ---------------------------------------------------------------- profile HMM


def test_model_log_stdv_is_single_precision_logf(models):
    _, meth = models
    got = pack_model(meth.level_mean, meth.level_stdv)[2]
    want = np.array([reference_hmm._libm.logf(float(x)) for x in meth.level_stdv], np.float32)
    assert np.array_equal(got, want)
    # the correctly rounded double log differs for some entries: the choice matters
    assert not np.array_equal(got, np.log(meth.level_stdv.astype(np.float64)).astype(np.float32))


def test_kmer_ranks_match_string_methylation_and_reverse_complement():
    window = "TCGACGCGTTAGCGACCGTACG"
    seq = ascii_(window)
    k = 6
    for methylated in (False, True):
        s = reference_hmm.methylate(window) if methylated else window
        rc = reference_hmm.reverse_complement(s)
        for ki in range(len(window) - k + 1):
            fwd = window_kmer_rank(seq, 0, len(window), ki, k, False, methylated, *CPG_MOTIF)
            rev = window_kmer_rank(seq, 0, len(window), ki, k, True, methylated, *CPG_MOTIF)
            assert fwd == reference_hmm.rank(s[ki : ki + k])
            assert rev == reference_hmm.rank(rc[len(s) - ki - k : len(s) - ki])


def simulated_events(meth_model, window, rc, rng, per_kmer=2, noise=1.5, scale=1.05, shift=-2.0):
    k = meth_model.k
    s = reference_hmm.methylate(window)
    if rc:
        s = reference_hmm.reverse_complement(s)
    levels = []
    for i in range(len(s) - k + 1):
        mu = meth_model.level_mean[reference_hmm.rank(s[i : i + k])]
        levels += [scale * mu + shift + rng.normal() * noise for _ in range(rng.integers(1, per_kmer + 2))]
    # events before and after the window, to be clipped
    levels = list(rng.uniform(70, 110, 3)) + levels + list(rng.uniform(70, 110, 4))
    return np.array(levels, np.float32)


@pytest.mark.parametrize("rc", [False, True])
def test_forward_equals_slow_reference(models, rc):
    _, meth = models
    rng = np.random.default_rng(11 if rc else 3)
    window = "GATTACGCTTGCGATCAGTCGGA"
    events = simulated_events(meth, window, rc, rng)
    n = len(events)
    # reverse strand: the window's first k-mer is read last
    e_start, e_stop = (n - 2, 1) if rc else (1, n - 2)
    model = pack_model(meth.level_mean, meth.level_stdv)
    scale, shift, var, epb = 1.05, -2.0, 1.3, 1.7
    scalings = pack_scalings(np.array([scale]), np.array([shift]), np.array([var]))[0]
    params = HmmParams().as_array()
    trans = block_transitions(epb, params)
    seq = ascii_("TT" + window + "AA")
    for methylated in (False, True):
        got = profile_forward(
            seq, 2, len(window), rc, methylated, *CPG_MOTIF, events, e_start, e_stop, 6, model, scalings, False, trans,
            params, LOGSUM_TABLE,
        )  # fmt: skip
        args = (window, events, e_start, e_stop, rc, methylated, meth.level_mean, meth.level_stdv, scale, shift, var, epb)
        assert got == reference_hmm.forward(*args)
        assert got == pytest.approx(reference_hmm.forward(*args, exact=True), abs=0.05)
    ll_u, ll_m = (profile_forward(seq, 2, len(window), rc, methylated, *CPG_MOTIF, events, e_start, e_stop, 6, model,
                                  scalings, False, trans, params, LOGSUM_TABLE) for methylated in (False, True))
    assert ll_m > ll_u  # the events were drawn from the methylated window


def test_forward_with_other_parameters_equals_reference(models):
    _, meth = models
    rng = np.random.default_rng(5)
    window = "CCGTAGCGTTACGA"
    events = simulated_events(meth, window, False, rng, per_kmer=1)
    p = HmmParams(p_skip=0.01, p_skip_self=0.2, p_bad=0.005, p_bad_self=0.01, start_to_clip=0.3, clip_self=0.8, background=-2.5)
    params = p.as_array()
    model = pack_model(meth.level_mean, meth.level_stdv)
    scalings = pack_scalings(np.array([1.0]), np.array([0.0]), np.array([1.1]))[0]
    got = profile_forward(
        ascii_(window), 0, len(window), False, True, *CPG_MOTIF, events, 0, len(events) - 1, 6, model, scalings, False,
        block_transitions(2.2, params), params, LOGSUM_TABLE,
    )  # fmt: skip
    want = reference_hmm.forward(
        window, events, 0, len(events) - 1, False, True, meth.level_mean, meth.level_stdv, 1.0, 0.0, 1.1, 2.2,
        p_skip=0.01, p_skip_self=0.2, p_bad=0.005, p_bad_self=0.01, start_to_clip=0.3, clip_self=0.8, background=-2.5,
    )  # fmt: skip
    assert got == want


def test_parallel_jobs_equal_single_windows(models):
    _, meth = models
    rng = np.random.default_rng(2)
    ref = ascii_("AACGTTTTCGGATCCGATTACGCGTTAACG" * 2)
    ref_off = np.array([0, 30, 60])
    ev = rng.uniform(70, 110, 120).astype(np.float32)
    ev_off = np.array([0, 50, 120])
    rc = np.array([False, True])
    scalings = pack_scalings(np.array([1.0, 0.97]), np.array([0.5, -1.0]), np.array([1.2, 1.4]))
    epb = np.array([1.6, 2.1])
    model = pack_model(meth.level_mean, meth.level_stdv)
    params = HmmParams().as_array()
    jobs = dict(read=[0, 1, 1], w0=[2, 0, 5], w1=[22, 30, 25], e1=[3, 60, 40], e2=[40, 10, 5])
    j = {key: np.array(v, np.int64) for key, v in jobs.items()}
    ll_u, ll_m = score_windows(
        j["read"], j["w0"], j["w1"], j["e1"], j["e2"], ref, ref_off, rc, ev, ev_off, scalings, epb, 6, model, *CPG_MOTIF,
        params, LOGSUM_TABLE, False,
    )  # fmt: skip
    for i in range(3):
        r = j["read"][i]
        trans = block_transitions(epb[r], params)
        events = ev[ev_off[r] : ev_off[r + 1]]
        for meth_flag, out in ((False, ll_u), (True, ll_m)):
            one = profile_forward(
                ref, ref_off[r] + j["w0"][i], j["w1"][i] - j["w0"][i], rc[r], meth_flag, *CPG_MOTIF, events, j["e1"][i],
                j["e2"][i], 6, model, scalings[r], False, trans, params, LOGSUM_TABLE,
            )  # fmt: skip
            assert out[i] == one



@pytest.mark.parametrize("nanopolish", [False, True])
def test_lanes_equal_single_windows(models, nanopolish):
    """`score_windows` runs its jobs sixteen to a group in SIMD lanes: groups of unlike windows (one k-mer to
    forty, 1 to 60 events either way, both strands, some without a site), groups whose methylated pass starts
    past their first blocks (no CpG in the reads' first 12 bases) and groups that start at block 0, a last
    group padded with a repeated job; each log-likelihood is the one-window pass's bit for bit. No jobs, no
    scores."""
    _, meth = models
    rng = np.random.default_rng(7 + nanopolish)
    n_reads = 4
    ref = ascii_("".join("".join(rng.choice(list("ACT"), 12)) + "".join(rng.choice(list("ACGTCG"), 48))
                         for _ in range(n_reads)))  # fmt: skip
    ref_off = np.arange(n_reads + 1) * 60
    ev_off = np.arange(n_reads + 1) * 70
    ev = rng.uniform(70, 110, ev_off[-1]).astype(np.float32)
    rc = np.array([False, True, True, False])
    epb = rng.uniform(1.2, 2.5, n_reads)
    params = HmmParams().as_array()
    scalings = pack_scalings(rng.uniform(0.9, 1.1, n_reads), rng.uniform(-2, 2, n_reads), rng.uniform(1, 1.5, n_reads))
    model = pack_model(meth.level_mean, meth.level_stdv)
    if nanopolish:  # its double model and scalings
        model, scalings = model.astype(np.float64), scalings.astype(np.float64)
    n = 37
    read = rng.integers(0, n_reads, n)
    w0 = rng.integers(0, 6, n)
    w1 = w0 + rng.integers(6, 40, n)
    e1 = rng.integers(0, 70, n)
    e2 = np.clip(e1 + rng.integers(-60, 60, n), 0, 69)
    w0[:2], w1[:2] = 0, [6, 7]  # one and two k-mers
    args = (ref, ref_off, rc, ev, ev_off, scalings, epb, 6, model, *CPG_MOTIF, params, LOGSUM_TABLE, nanopolish)
    ll_u, ll_m = score_windows(read, w0, w1, e1, e2, *args)
    for i in range(n):
        r = read[i]
        for meth_flag, out in ((False, ll_u), (True, ll_m)):
            one = profile_forward(
                ref, ref_off[r] + w0[i], w1[i] - w0[i], rc[r], meth_flag, *CPG_MOTIF, ev[ev_off[r] : ev_off[r + 1]], e1[i],
                e2[i], 6, model, scalings[r], nanopolish, block_transitions(epb[r], params), params, LOGSUM_TABLE,
            )  # fmt: skip
            assert out[i] == one
    none = np.zeros(0, np.int64)
    assert [len(a) for a in score_windows(none, none, none, none, none, *args)] == [0, 0]


# ---------------------------------------------------------------- batch calls


def simulated_read(kmer_model, meth_model, read_id, ref, rc, cigar, rng, ref_start=5000):
    """A read that is exactly its reference span, with events two per k-mer drawn from the CpG model."""
    seq = reference_hmm.reverse_complement(ref) if rc else ref
    signal = SignalRecord(read_id, np.zeros(8, np.int16), 1.0, 0.0, 1.0, 4000.0)
    inp = ReadInput(read_id, seq, signal, "chrT", ref_start, ref_start + len(ref), rc, cigar, ref)
    k = meth_model.k
    meth_seq = reference_hmm.methylate(seq)
    levels = [meth_model.level_mean[reference_hmm.rank(meth_seq[i : i + k])] + rng.normal() for i in range(len(seq) - k + 1)]
    return inp, np.repeat(np.array(levels, np.float32), 2)


def make_batch(models, specs, rng):
    kmer, meth = models
    reads, events = [], []
    for read_id, ref, rc, cigar in specs:
        inp, ev = simulated_read(kmer, meth, read_id, ref, rc, cigar, rng)
        reads.append(inp)
        events.append(ev)
    b = pack(reads)
    b.ev_mean = np.concatenate(events)
    b.ev_off = np.concatenate([[0], np.cumsum([len(e) for e in events])]).astype(np.int64)
    n_kmers = [len(r.seq) - meth.k + 1 for r in reads]
    b.aln_kmer = np.concatenate([np.repeat(np.arange(n), 2) for n in n_kmers]).astype(np.int32)
    b.aln_event = np.concatenate([np.arange(2 * n) for n in n_kmers]).astype(np.int32)
    b.aln_off = np.concatenate([[0], np.cumsum([2 * n for n in n_kmers])]).astype(np.int64)
    b.shift = np.zeros(b.n, np.float32)
    b.scale = np.ones(b.n, np.float32)
    b.var = np.ones(b.n, np.float32)
    return b


def random_ref(rng, length, cpgs):
    s = list(rng.choice(list("ATTA"), length))  # no C or G: the only CpGs are the planted ones
    for p in cpgs:
        s[p : p + 2] = "CG"
    return "".join(s)


def test_call_methylation_on_a_small_batch(models):
    rng = np.random.default_rng(4)
    fwd = random_ref(rng, 200, [50, 57, 120])
    rev = random_ref(rng, 200, [80])
    spliced = random_ref(rng, 200, [80])
    specs = [
        ("fwd", fwd, False, cig((CIGAR_M, 200))),
        ("none", random_ref(rng, 200, []), False, cig((CIGAR_M, 200))),
        ("rev", rev, True, cig((CIGAR_M, 200))),
        ("spliced", spliced, False, cig((CIGAR_M, 100), (CIGAR_N, 0), (CIGAR_M, 100))),
        ("failed", fwd, False, cig((CIGAR_M, 200))),
    ]
    b = make_batch(models, specs, rng)
    b.status[4] = Skip.ALIGNMENT_FAILED
    calls = call_methylation(b, *models)
    assert calls.read.tolist() == [0, 0, 2]
    assert calls.start.tolist() == [5050, 5120, 5080] and calls.end.tolist() == [5057, 5120, 5080]
    assert calls.strand.tolist() == [1, 1, -1]
    assert calls.num_motifs.tolist() == [2, 1, 1]
    assert calls.sequence.tolist() == [fwd[45:63], fwd[115:126], rev[75:86]]
    assert np.all(calls.llr > 0)  # events drawn from the methylated model
    assert np.array_equal(calls.llr, calls.ll_meth - calls.ll_unmeth)
    assert b.status.tolist() == [Skip.OK, Skip.NO_CPG, Skip.OK, Skip.SPLICED, Skip.ALIGNMENT_FAILED]

    # the first group's window [40, 67] on k-mers 2i -> events 2i: events 80..134
    _, meth = models
    want = reference_hmm.forward(
        fwd[40:68], b.ev_mean[: b.ev_off[1]], 80, 134, False, True, meth.level_mean, meth.level_stdv, 1.0, 0.0, 1.0,
        (2 * 195 - 1 - 0) / 195,
    )  # fmt: skip
    assert calls.ll_meth[0] == want
    # reverse strand: window [70, 90], read k-mer of reference base p is 200 - p - 6
    want = reference_hmm.forward(
        rev[70:91], b.ev_mean[b.ev_off[2] : b.ev_off[3]], 2 * 124, 2 * 104, True, False, meth.level_mean,
        meth.level_stdv, 1.0, 0.0, 1.0, 389 / 195,
    )  # fmt: skip
    assert calls.ll_unmeth[2] == want

    # recalibration's own log var, when given, replaces the log of the float32 var
    again = call_methylation(b, *models, log_var=np.log(b.var.astype(np.float64)))
    assert np.array_equal(again.llr, calls.llr)
    shifted = call_methylation(b, *models, log_var=np.full(b.n, 0.1))
    assert np.all(shifted.ll_meth < calls.ll_meth)  # a larger log stdv in every emission

    text = format_calls(calls, b.read_ids, b.ref_names)
    first = text.splitlines()[0].split("\t")
    assert len(first) == len(CALLS_HEADER.split("\t")) == 11
    assert first[:5] == ["chrT", "+", "5050", "5057", "fwd"]
    assert first[5] == f"{calls.llr[0]:.2f}" and first[8:10] == ["1", "2"]
    assert text.splitlines()[2].split("\t")[1] == "-"
