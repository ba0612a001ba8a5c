"""Event detection: exact agreement with f5c 1.1, edge cases, and batch = per-read."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from streamer.pipeline.event_cells import event_cells, scratch_size
from streamer.pipeline.events import (DNA_PARAMS, RNA_PARAMS, EventParams, alone_reads, batch_peaks, detect_events,
                                      event_offsets, lane_groups, reverse_events)  # fmt: skip
from streamer.pipeline.targets import CPU
from streamer.io.fast5 import fast5_read_ids, iter_fast5, read_fast5

DATA = Path(__file__).parent / "data" / "ecoli"
READ1 = "fa9ad683-35c5-4dad-a3af-de7a86b1ffa8"
REGION = Path("/work/shared/data/ecoli_2kb_region")
needs_region = pytest.mark.skipif(not (REGION / "fast5_files").is_dir(), reason="shared E. coli data absent")


def _events(signal, params=DNA_PARAMS):
    signal = np.asarray(signal, dtype=np.float32)
    return detect_events(signal, np.array([0, len(signal)]), params)


def _pack(signals):
    off = np.zeros(len(signals) + 1, np.int64)
    np.cumsum([len(s) for s in signals], out=off[1:])
    return np.concatenate(signals).astype(np.float32), off


def _find(fast5_dir: Path, read_id: str):
    for path in sorted(fast5_dir.glob("*.fast5")):
        if read_id in fast5_read_ids(path):
            return read_fast5(path, read_id)
    raise AssertionError(f"{read_id} not in {fast5_dir}")


def _check_tiling(ev_off, ev_start, ev_length, signal_off):
    """Events of each read are contiguous, non-empty and cover the read exactly."""
    for r in range(len(signal_off) - 1):
        n = signal_off[r + 1] - signal_off[r]
        st = ev_start[ev_off[r] : ev_off[r + 1]]
        ln = ev_length[ev_off[r] : ev_off[r + 1]].astype(np.int64)
        if n == 0:
            assert len(st) == 0
            continue
        assert st[0] == 0 and np.all(ln >= 1)
        assert np.array_equal(st[1:], st[:-1] + ln[:-1]) and st[-1] + ln[-1] == n


def test_read1_matches_f5c_exactly():
    rows = re.findall(r"\{([^}]*)\}", (DATA / "read1.events.exp").read_text())
    exp = np.array([[float(v) for v in row.split(",")[:4]] for row in rows])
    pa = _find(DATA / "fast5", READ1).to_pa()
    ev_off, start, length, mean, stdv = _events(pa)
    assert ev_off.tolist() == [0, len(exp)]
    assert np.array_equal(start, exp[:, 0].astype(np.int64))
    assert np.array_equal(length, exp[:, 1])
    np.testing.assert_allclose(mean, exp[:, 2], rtol=0, atol=1e-4)
    np.testing.assert_allclose(stdv, exp[:, 3], rtol=0, atol=1e-4)
    # f5c prints %f: agree on every printed digit.
    assert [f"{v:f}" for v in mean] == [f"{v:f}" for v in exp[:, 2]]
    assert [f"{v:f}" for v in stdv] == [f"{v:f}" for v in exp[:, 3]]


def test_output_types():
    out = _events(np.linspace(80, 120, 100))
    assert [a.dtype for a in out] == [np.int64, np.int64, np.float32, np.float32, np.float32]


def test_clean_step_gives_one_boundary():
    ev_off, start, length, mean, stdv = _events(np.r_[np.full(50, 100.0), np.full(50, 120.0)])
    assert start.tolist() == [0, 50] and length.tolist() == [50, 50]
    assert mean.tolist() == [100, 120] and stdv.tolist() == [0, 0]


def test_noisy_steps_are_boundaries():
    levels = np.repeat([80.0, 110.0, 90.0], 60)
    noisy = levels + np.random.default_rng(3).normal(0, 0.3, len(levels))
    _, start, length, mean, stdv = _events(noisy)
    assert {60, 120} <= set(start.tolist())
    seg = [noisy[s : s + int(n)] for s, n in zip(start, length)]
    np.testing.assert_allclose(mean, [s.mean() for s in seg], rtol=1e-5)
    # f5c's one-pass float32 variance loses ~1e-3 pA^2 to cancellation at 100 pA.
    np.testing.assert_allclose(stdv, [s.std() for s in seg], rtol=0, atol=0.01)


def test_short_window_alone_when_long_window_does_not_fit():
    # 8 samples: 2*w1 <= n < 2*w2, so only the short detector has t values.
    _, start, _, mean, _ = _events(np.r_[np.full(4, 100.0), np.full(4, 120.0)])
    assert start.tolist() == [0, 4] and mean.tolist() == [100, 120]


@pytest.mark.parametrize("n", [1, 2, 5, 6, 13, 200])
def test_flat_or_short_signal_is_one_event(n):
    ev_off, start, length, mean, stdv = _events(np.full(n, 91.25))
    assert ev_off.tolist() == [0, 1]
    assert (start[0], length[0], mean[0], stdv[0]) == (0, n, np.float32(91.25), 0)


def test_empty_batch_and_empty_read():
    ev_off, start, *_ = detect_events(np.zeros(0, np.float32), np.zeros(1, np.int64))
    assert ev_off.tolist() == [0] and len(start) == 0
    ev_off, start, length, *_ = detect_events(np.full(10, 5.0, np.float32), np.array([0, 0, 10, 10]))
    assert ev_off.tolist() == [0, 0, 1, 1] and start.tolist() == [0] and length.tolist() == [10]


def test_batch_equals_one_read_at_a_time():
    signals = [r.to_pa() for path in sorted((DATA / "fast5").glob("*.fast5")) for r in iter_fast5(path)]
    signals.insert(2, np.zeros(0, np.float32))
    signals.insert(4, np.full(5, 70.0, np.float32))
    signal, signal_off = _pack(signals)
    ev_off, start, length, mean, stdv = detect_events(signal, signal_off)
    _check_tiling(ev_off, start, length, signal_off)
    for r, s in enumerate(signals):
        one = _events(s)
        sl = slice(ev_off[r], ev_off[r + 1])
        for batch_part, single in zip((start, length, mean, stdv), one[1:]):
            assert np.array_equal(batch_part[sl], single)


def test_rna_params_segment_coarser():
    pa = _find(DATA / "fast5", READ1).to_pa()
    assert 0 < _events(pa, RNA_PARAMS)[0][-1] < _events(pa, DNA_PARAMS)[0][-1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="float32"):
        detect_events(np.zeros(10, np.float64), np.array([0, 10]))
    with pytest.raises(ValueError, match="within the signal"):
        detect_events(np.zeros(10, np.float32), np.array([0, 11]))
    with pytest.raises(ValueError, match="window"):
        EventParams(w1=0)


@needs_region
def test_region_reads_all_segment_sanely():
    records = [r for path in sorted((REGION / "fast5_files").glob("*.fast5")) for r in iter_fast5(path)]
    assert len(records) == 112
    signal, signal_off = _pack([r.to_pa() for r in records])
    ev_off, start, length, mean, stdv = detect_events(signal, signal_off)
    _check_tiling(ev_off, start, length, signal_off)
    per_sample = np.diff(ev_off) / np.diff(signal_off)
    assert np.all((per_sample > 0.05) & (per_sample < 0.5))
    assert np.all((mean > 0) & (mean < 400)) and np.all(np.isfinite(stdv)) and np.all(stdv >= 0)


@needs_region
def test_region_events_match_f5c_eventalign():
    """f5c's eventalign (--signal-index) gives each aligned event's sample span, mean and stdv."""
    expected: dict[str, list[tuple[int, str, str, int, int]]] = {}
    with gzip.open(REGION / "expected" / "f5c-1.1" / "eventalign.first3reads.tsv.gz", "rt") as fh:
        header = next(fh).rstrip("\n").split("\t")
        for line in fh:
            c = dict(zip(header, line.rstrip("\n").split("\t")))
            span = (int(c["start_idx"]), int(c["end_idx"]))
            row = (int(c["event_index"]), c["event_level_mean"], c["event_stdv"], *span)
            expected.setdefault(c["read_name"], []).append(row)
    assert len(expected) == 3
    for read_id, rows in expected.items():
        _, start, length, mean, stdv = _events(_find(REGION / "fast5_files", read_id).to_pa())
        idx = np.array([r[0] for r in rows])
        assert np.array_equal(start[idx], [r[3] for r in rows])
        assert np.array_equal(start[idx] + length[idx].astype(np.int64), [r[4] for r in rows])
        assert [f"{v:.2f}" for v in mean[idx]] == [r[1] for r in rows]
        assert [f"{v:.3f}" for v in stdv[idx]] == [r[2] for r in rows]


def test_reverse_events_turns_each_read_round_in_place():
    """Direct RNA: each read's events in the other order, each keeping its own samples; twice is once."""
    rng = np.random.default_rng(8)
    pa = [rng.normal(90, 8, n).astype(np.float32) for n in (0, 40, 1, 2000, 777)]
    off = np.zeros(len(pa) + 1, np.int64)
    np.cumsum([len(p) for p in pa], out=off[1:])
    events = detect_events(np.concatenate(pa), off, RNA_PARAMS)
    ev_off, arrays = events[0], [a.copy() for a in events[1:]]
    reverse_events(ev_off, *arrays)
    for r in range(len(pa)):
        a, b = ev_off[r], ev_off[r + 1]
        for got, want in zip(arrays, events[1:]):
            assert np.array_equal(got[a:b], want[a:b][::-1])
    reverse_events(ev_off, *arrays)
    assert all(np.array_equal(got, want) for got, want in zip(arrays, events[1:]))


def test_without_the_spread_the_means_alone_and_they_reverse_alone():
    """A run that renders no event makes only the means (and the offsets): the same as with everything, the
    starts, lengths and spreads empty of their types; direct RNA's reversal then turns the means alone."""
    rng = np.random.default_rng(9)
    pa = [rng.normal(90, 8, n).astype(np.float32) for n in (0, 40, 1, 2000, 777)]
    signal, off = _pack(pa)
    full = detect_events(signal, off, RNA_PARAMS)
    means = detect_events(signal, off, RNA_PARAMS, spread=False)
    assert np.array_equal(means[0], full[0]) and np.array_equal(means[3].view(np.uint32), full[3].view(np.uint32))
    assert [(len(x), x.dtype) for x in means[1:3] + means[4:]] == [(0, x.dtype) for x in full[1:3] + full[4:]]
    reverse_events(*means)
    reverse_events(*full)
    assert np.array_equal(means[3], full[3]) and all(len(x) == 0 for x in means[1:3] + means[4:])


def _one_read_events(signal, signal_off, p):
    """The events as a GPU thread forms them, one read alone (`event_cells`' read_peaks and fill_read), on the CPU."""
    cells = event_cells(CPU)
    settings = (np.int32(p.w1), np.int32(p.w2), np.float32(p.threshold1), np.float32(p.threshold2),
                np.float32(p.peak_height))  # fmt: skip
    peaks = np.zeros(len(signal), np.int32)
    n_peaks = np.zeros(len(signal_off) - 1, np.int64)
    step = 16  # the GPU's block
    size = scratch_size(p.w1, p.w2, step)
    for r in range(len(signal_off) - 1):
        a, n = signal_off[r], signal_off[r + 1] - signal_off[r]
        t1, t2 = np.zeros(step, np.float32), np.zeros(step, np.float32)
        n_peaks[r] = cells.read_peaks(signal, a, n, settings, np.zeros(size), np.zeros(size), t1, t2, peaks, a)
    ev_off = event_offsets(signal_off, n_peaks)
    out = [np.zeros(ev_off[-1], np.int64)] + [np.zeros(ev_off[-1], np.float32) for _ in range(3)]
    for r in range(len(signal_off) - 1):
        if ev_off[r + 1] > ev_off[r]:
            a, n = signal_off[r], signal_off[r + 1] - signal_off[r]
            cells.fill_read(signal, a, n, peaks, a, n_peaks[r], np.zeros(size), np.zeros(size), *out, ev_off[r])
    return ev_off, *out


@pytest.mark.parametrize(
    "params",
    [DNA_PARAMS, RNA_PARAMS, EventParams(w1=1, w2=31, threshold1=0.5, threshold2=3.0, peak_height=0.1),
     EventParams(w1=3, w2=4, threshold1=50.0, threshold2=0.5),  # the long detector unmasked: it emits
     EventParams(peak_height=-0.5)],
    ids=["dna", "rna", "odd_windows", "long_detector", "negative_height"],
)  # fmt: skip
def test_lanes_match_one_read_at_a_time(params):
    """The CPU kernel's lanes (groups of reads refilled as reads end, blocks across read ends) give the
    events the one-read path gives, bit for bit, whatever the group size."""
    rng = np.random.default_rng(11)
    fixture = [r.to_pa()[:6000] for path in sorted((DATA / "fast5").glob("*.fast5")) for r in iter_fast5(path)]
    steps = [np.repeat(rng.normal(90, 15, n // 6 + 1), 6)[:n] + rng.normal(0, 2, n) for n in rng.integers(0, 1500, 40)]
    signal, signal_off = _pack(fixture + [np.zeros(0), np.full(3, 80.0)] + steps)
    want = _one_read_events(signal, signal_off, params)
    assert want[0][-1] > len(signal) // 100
    settings = (np.int32(params.w1), np.int32(params.w2), np.float32(params.threshold1),
                np.float32(params.threshold2), np.float32(params.peak_height))  # fmt: skip
    order, _, _ = lane_groups(np.diff(signal_off), 1)
    n_reads = len(order)
    for alone, bounds in ((0, np.array([0, n_reads])), lane_groups(np.diff(signal_off), 3)[1:],
                          (0, np.r_[0:n_reads:23, n_reads]), (7, np.r_[7:n_reads:23, n_reads]),
                          (n_reads, np.array([n_reads, n_reads]))):  # fmt: skip
        peaks = np.zeros(len(signal), np.int32)
        n_peaks = batch_peaks(signal, signal_off, settings, order, alone, bounds, peaks)
        assert np.array_equal(n_peaks, np.diff(want[0]) - (np.diff(signal_off) > 0))
    got = detect_events(signal, signal_off, params)
    assert all(g.dtype == w.dtype and np.array_equal(g.view(np.uint8), w.view(np.uint8)) for g, w in zip(got, want))


def test_lane_groups_split_the_samples_longest_first():
    lengths = np.array([5, 900, 0, 40, 7000, 12, 300] * 10)
    order, alone, bounds = lane_groups(lengths, 1)
    assert np.all(np.diff(lengths[order]) <= 0) and sorted(order) == list(range(70))
    # one thread: the ten longest side by side in lanes end together, sooner than four times their work alone
    assert alone == 0 and bounds.tolist() == [0, 16, 32, 48, 70]  # groups of 16 reads or more
    order, alone, bounds = lane_groups(np.full(100, 50), 1)
    assert alone == 0 and bounds.tolist() == [0, 25, 50, 75, 100]
    _, alone, bounds = lane_groups(np.zeros(0, np.int64), 4)
    assert alone == 0 and bounds.tolist() == [0, 0]


def test_a_read_runs_alone_where_in_a_lane_it_would_hold_its_thread_past_the_others():
    # one read of 2.2 M samples among 200 of 50 k: in a lane it would take 16 x 2.2 M steps' time
    lengths = np.append(np.full(200, 50_000), 2_200_000)
    for threads in (1, 2, 16):
        order, alone, _ = lane_groups(lengths, threads)
        assert alone == 1 and order[0] == 200
    # on many threads the longest go alone until a lane's longest read fits a thread's share of the work
    lengths = np.linspace(1_000, 110_000, 224).astype(np.int64)
    shares = [alone_reads(np.sort(lengths)[::-1], t) for t in (1, 2, 4, 8, 16, 64)]
    assert shares[:3] == [0, 0, 0] and shares == sorted(shares) and 0 < shares[4] < 224 // 2
    # and never so many that the work they add outweighs what it saves: alone a sample costs ALONE_COST
    assert alone_reads(np.full(100, 50), 16) == 0


BOUNDS_SCRIPT = """
import hashlib, sys
import numpy as np
from streamer.pipeline.events import DNA_PARAMS, RNA_PARAMS, EventParams, detect_events
signal = np.fromfile(sys.argv[1], np.float32)
off = np.fromfile(sys.argv[2], np.int64)
for p in (DNA_PARAMS, RNA_PARAMS, EventParams(w1=1, w2=31, threshold1=0.5, threshold2=3.0, peak_height=0.1)):
    for batch in ((signal, off), (signal[off[1]:off[3]], off[1:4] - off[1])):  # many reads; two, lanes left idle
        print(hashlib.sha256(b"".join(a.tobytes() for a in detect_events(*batch, p))).hexdigest())
"""


def test_kernels_stay_within_their_arrays(tmp_path):
    """Under numba's bounds checking (compiled afresh) every index of the kernels is in its array, and the
    events are those of the unchecked kernels. The kernels' unsigned offsets escape numba's wraparound,
    so a slip would read or write outside the array instead of failing."""
    rng = np.random.default_rng(4)
    fixture = [r.to_pa()[:3000] for path in sorted((DATA / "fast5").glob("*.fast5")) for r in iter_fast5(path)]
    signal, off = _pack(fixture[:3] + [np.zeros(0), rng.normal(90, 9, 700)] + fixture[3:] + [np.full(2, 60.0)])
    signal.tofile(tmp_path / "signal")
    off.tofile(tmp_path / "off")
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", BOUNDS_SCRIPT, tmp_path / "signal", tmp_path / "off"], env=env,
                          capture_output=True, text=True, cwd=Path(__file__).parents[1])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    want = []
    for p in (DNA_PARAMS, RNA_PARAMS, EventParams(w1=1, w2=31, threshold1=0.5, threshold2=3.0, peak_height=0.1)):
        for batch in ((signal, off), (signal[off[1] : off[3]], off[1:4] - off[1])):
            want.append(hashlib.sha256(b"".join(a.tobytes() for a in detect_events(*batch, p))).hexdigest())
    assert proc.stdout.split() == want
