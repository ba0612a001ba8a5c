"""call-methylation rows from the numba writer are Python's formatting byte for byte."""

from __future__ import annotations

import numpy as np

from streamer_plugins.cpg.calls import MethCalls, _format_calls_python, format_calls
from streamer_plugins.texts import Texts

EDGES = [0.0, -0.0, 0.005, -0.005, 0.015, 0.025, 0.125, -0.125, 0.375, 2.675, 0.994999999, 0.995, 9.995, 99.995,
         1e-300, -1e-300, 5e-324, 2.0**49, -(2.0**49) + 0.5, 123456.785, np.inf, -np.inf, np.nan]  # fmt: skip


def _calls(values: np.ndarray, rng) -> MethCalls:
    n = len(values)
    return MethCalls(
        read=rng.integers(0, 3, n),
        start=rng.integers(0, 10**9, n),
        end=rng.integers(0, 10**9, n),
        strand=np.where(rng.random(n) < 0.5, 1, -1).astype(np.int8),
        llr=values,
        ll_meth=np.roll(values, 7),
        ll_unmeth=np.roll(values, 13),
        num_motifs=rng.integers(1, 40, n).astype(np.int32),
        sequence=Texts.of(["AACGT"[: i % 6] + "CG" for i in range(n)]),
    )


def test_rows_match_python_formatting():
    rng = np.random.default_rng(5)
    n = 50_000
    values = np.concatenate([
        rng.normal(-90, 30, n).astype(np.float32).astype(np.float64),  # log-likelihoods
        rng.normal(-90, 30, n).astype(np.float32).astype(np.float64) - rng.normal(-90, 30, n).astype(np.float32),
        rng.integers(-10**6, 10**6, n) / 8.0,  # exact ties at the third decimal: round half to even
        rng.integers(-1000, 1000, n) / 200.0,
        rng.normal(0, 1e9, n),
        np.array(EDGES),
    ])  # fmt: skip
    calls = _calls(values, rng)
    ids, refs = ["r-a", "r-ü", "r-c"], ["chrI", "chrII", "chrIII"]
    assert format_calls(calls, ids, refs) == _format_calls_python(calls, ids, refs)


def test_values_beyond_the_exact_range_fall_back_to_python():
    rng = np.random.default_rng(6)
    calls = _calls(np.array([1.5, 2.0**60 + 2048.0, -3.25]), rng)
    text = format_calls(calls, ["a", "b", "c"], ["x", "y", "z"])
    assert text == _format_calls_python(calls, ["a", "b", "c"], ["x", "y", "z"])
    assert "\t1152921504606849024.00\t" in text


def test_no_calls_is_empty_text():
    calls = _calls(np.zeros(0), np.random.default_rng(7))
    assert format_calls(calls, [], []) == ""
