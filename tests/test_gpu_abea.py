"""GPU ABEA: identical to the CPU under numba's CUDA simulator (and on a GPU when there is one),
the CPU/GPU split rules, the fallback on a CUDA error, and the no-GPU path."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from streamer.pipeline.gpu import CudaOptions
import streamer_gpu
from streamer_gpu import open_gpu
from streamer_gpu.host import CPU, GPU, ULTRA, assign_reads

from conftest import ROOT

CASES = Path(__file__).parent / "gpu_cases.py"
HAS_CUDA_MODULE = importlib.util.find_spec("numba.cuda") is not None

# tests/gpu_cases.py `crafted`: two windows fill the tiny arena, three more run out of it, then a
# long read, an ultra-long one, one over max_epk, an over-segmented one and one skipped earlier
CRAFTED_OWNERS = ["gpu", "gpu", "cpu", "cpu", "cpu", "cpu", "ultra", "cpu", "cpu", "cpu"]


def _gpu_present() -> bool:
    if not HAS_CUDA_MODULE:
        return False
    code = "from numba import cuda; print(int(cuda.is_available()))"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    return out.stdout.strip() == "1"


def case_env() -> dict[str, str]:
    """The environment of a case script: this checkout's import roots first, the simulator off."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    roots = [str(ROOT / "plugins"), str(ROOT / "gpu"), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(roots + [p for p in [env.get("PYTHONPATH", "")] if p])
    return env


def run_cases(target: str, script: Path, *args: str, **env: str) -> dict:
    """A case script's JSON, run under the CUDA simulator or on the GPU (skipped where neither is)."""
    env = case_env() | env
    if target == "simulator":
        if not HAS_CUDA_MODULE:
            pytest.skip("neither numba-cuda nor numba's built-in CUDA target is installed")
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    elif not _gpu_present():
        pytest.skip("no CUDA GPU")
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module", params=["simulator", "gpu"])
def cases(request) -> dict:
    return run_cases(request.param, CASES)


def test_fixture_reads_identical_to_cpu(cases):
    case = cases["windows"]
    assert case["diff"] == []
    assert case["reference_diff"] == []  # and each read as tests/reference_abea.py aligns it
    assert case["status"] == [0, 0, 0, 0, 10]  # the mismatched read fails QC on both
    stats = case["stats"]
    assert stats["n_gpu"] == 5 and stats["n_cpu"] == 0 and stats["fallback"] == ""
    assert stats["cells"] > 0 and 0 < stats["x_util"] < 1 and 0 < stats["y_util"] < 1


def test_crafted_batch_goes_where_the_rules_send_it(cases):
    case = cases["crafted"]
    assert case["owner"] == CRAFTED_OWNERS
    assert case["counts"] == [3, 1, 1]  # n_memout, n_long, n_events
    stats = case["stats"]
    assert (stats["n_gpu"], stats["n_cpu"], stats["n_ultra"]) == (2, 7, 1)
    assert (stats["n_memout"], stats["n_long"], stats["n_events"]) == (3, 1, 1)
    assert stats["x_util"] > 0.7
    assert case["status"][8:] == [9, 2]  # over-segmented, low mapq: unchanged paths
    assert case["diff"] == []


def test_avg_epk_change_repartitions_the_arena_in_place(cases):
    case = cases["repartition"]
    assert case["same_buffer"] and case["avg_epk"] == 3.0
    (bases, events, rows, _), (bases3, events3, rows3, _) = case["before"], case["after"]
    assert bases3 < bases and events3 > events and events3 == int(3.0 * bases3) and rows3 == bases3 + events3
    assert case["diff"] == []


def test_cuda_error_moves_the_batch_to_the_cpu(cases):
    case = cases["fallback"]
    assert case["diff"] == []
    assert "CUDA_ERROR_OUT_OF_MEMORY" in case["stats"]["fallback"]
    assert case["stats"]["n_gpu"] == 0


def _batch(lengths, events, status=None):
    seq_off = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=seq_off[1:])
    ev_off = np.zeros(len(events) + 1, np.int64)
    np.cumsum(events, out=ev_off[1:])
    st = np.zeros(len(lengths), np.int8) if status is None else np.array(status, np.int8)
    return seq_off, ev_off, st


def test_split_rules_in_batch_order():
    # mean length 11500 / 9 = 1278: max_lf 1.5 sends > 1917 bases to the CPU; ultra_thresh 5000
    # sets 6000 aside; 3000 events on 500 bases is 6 per base, over max_epk 5; 8000 on 500 is
    # 16, over-segmented (the CPU flags it, no count); 500 + 500 + 400 bases fill an arena of
    # 1400, so the 500-base read after them is a memory-out; the last read failed earlier
    lengths = [500, 500, 2500, 6000, 500, 500, 400, 500, 100]
    events = [1000, 1000, 4000, 12000, 3000, 8000, 800, 900, 200]
    seq_off, ev_off, status = _batch(lengths, events, [0, 0, 0, 0, 0, 0, 0, 0, 2])
    owner, counts = assign_reads(seq_off, ev_off, status, 6, 15.0, 1.5, 5.0, 5000, 1400, 10_000, 10_000, 100)
    assert owner.tolist() == [GPU, GPU, CPU, ULTRA, CPU, CPU, GPU, CPU, CPU]
    rows = (1000 + 495 + 2) * 2 + (800 + 395 + 2)
    assert counts.tolist() == [1, 1, 1, 1400, 2800, rows]


def test_split_counts_rows_and_read_slots():
    seq_off, ev_off, status = _batch([100] * 4, [200] * 4)
    owner, counts = assign_reads(seq_off, ev_off, status, 6, 15.0, 3.0, 5.0, 10**6, 10**6, 10**6, 10**6, 3)
    assert owner.tolist() == [GPU, GPU, GPU, CPU] and counts[0] == 1
    owner, _ = assign_reads(seq_off, ev_off, status, 6, 15.0, 3.0, 5.0, 10**6, 10**6, 10**6, 2 * 297, 10)
    assert owner.tolist() == [GPU, GPU, CPU, CPU]


def test_disabled_or_absent_gpu_means_cpu_in_one_log_line(caplog, monkeypatch):
    assert open_gpu(CudaOptions(disable=True)) is None
    if _gpu_present():
        pytest.skip("a GPU is present")
    monkeypatch.setattr(streamer_gpu, "_said", set())  # as in a new process
    with caplog.at_level(logging.INFO, logger="streamer_gpu"):
        assert open_gpu(CudaOptions()) is None
        assert open_gpu(CudaOptions()) is None  # a daemon's second pipeline (another pore): no second line
    lines = [r for r in caplog.records if r.name.startswith("streamer_gpu")]
    assert len(lines) == 1 and "ABEA runs on the CPU" in lines[0].getMessage()
