"""GPU methylation HMM: bit-identical to the CPU `score_windows` under numba's CUDA simulator (and on a
GPU when there is one), CpG's and the other motifs' windows, windows over the kernel's capacity and
failed batches scored on the CPU, and the host-side helpers and the no-GPU path without CUDA; R10.4.1 calls at k = 9 through the whole
pipeline (ABEA and HMM on the GPU) identical to the CPU's."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from streamer.pipeline.gpu import CudaOptions
import streamer_gpu
from streamer_plugins.cpg.hmm_model import HmmParams, block_transitions, clip_flanks, flank_table, read_transitions
from streamer_plugins.cpg.hmm_gpu import open_gpu_hmm
from streamer_plugins.cpg.hmm_jobs import launch_order, pack_jobs
from test_gpu_abea import _gpu_present, run_cases

CASES = Path(__file__).parent / "gpu_hmm_cases.py"
R10_CASES = Path(__file__).parent / "gpu_r10_cases.py"
R10_TABLE = Path(__file__).resolve().parents[2] / "shared" / "models" / "r10" / "dna_r10.4.1_400bps_9mer.npz"


@pytest.fixture(scope="module", params=["simulator", "gpu"])
def cases(request) -> dict:
    return run_cases(request.param, CASES)


@pytest.fixture(scope="module", params=["simulator", "gpu"])
def r10_cases(request, tmp_path_factory) -> dict:
    if not R10_TABLE.is_file():
        pytest.skip("../shared R10 model not present")
    cache = tmp_path_factory.mktemp("model-cache")
    return run_cases(request.param, R10_CASES, str(R10_TABLE), STREAMER_MODEL_CACHE_DIR=str(cache))


def test_windows_identical_to_cpu(cases):
    case = cases["windows"]
    assert case["diff"] == 0 and case["finite"]
    assert cases["rc"] == [False, True]  # both strands
    stats = case["stats"]
    assert stats["n_gpu"] == case["n"] and stats["n_cpu"] == 0 and stats["fallback"] == ""
    assert stats["cells"] > 0


def test_r10_calls_at_k9_identical_on_the_gpu(r10_cases):
    """Simulated R10.4.1 reads on both strands: ABEA and the HMM on the GPU write the CPU's TSV."""
    assert r10_cases["k"] == 9
    cpu, gpu = r10_cases["cpu"], r10_cases["gpu"]
    assert cpu.count("\n") >= 4 and {row.split("\t")[1] for row in cpu.splitlines()} == {"+", "-"}
    assert gpu == cpu
    abea, hmm = r10_cases["gpu_abea"], r10_cases["gpu_hmm"]
    assert abea["n_gpu"] == abea["n_reads"] > 0 and abea["fallback"] == ""
    assert hmm["n_gpu"] > 0 and hmm["n_cpu"] == 0 and hmm["fallback"] == ""
    assert r10_cases["cpu_abea"] is None and r10_cases["cpu_hmm"] is None


def test_9mer_windows_identical_to_cpu(cases):
    case = cases["k9"]
    assert case["diff"] == 0 and case["finite"]
    assert case["stats"]["n_gpu"] == case["n"] == 4


@pytest.mark.parametrize("motif", ["gpc", "dam", "dcm"])
def test_other_motifs_identical_to_cpu(cases, motif):
    """GpC, dam and dcm windows of the fixture, in nanopolish's double-precision scaling: the CPU's bits."""
    case = cases[motif]
    assert case["diff"] == 0 and case["finite"] and case["n"] > 0
    assert case["levels"] == "float64" and case["nanopolish"] and case["rc"] == [False, True]
    assert case["stats"]["n_gpu"] == case["n"] and case["stats"]["fallback"] == ""


def test_launch_order_does_not_change_answers(cases):
    assert cases["in_job_order"]["diff"] == 0


def test_windows_over_capacity_go_to_the_cpu(cases):
    case = cases["capacity"]
    assert case["diff"] == 0
    assert case["over"] > 0
    assert (case["stats"]["n_cpu"], case["stats"]["n_gpu"]) == (case["over"], case["n"] - case["over"])


def test_cuda_error_scores_the_batch_on_the_cpu(cases):
    case = cases["fallback"]
    assert case["diff"] == 0
    assert "CUDA_ERROR_OUT_OF_MEMORY" in case["stats"]["fallback"]
    assert case["stats"]["n_gpu"] == 0 and case["stats"]["n_cpu"] == case["n"]


@pytest.mark.parametrize("n_events", [1, 2, 3, 17])
def test_one_flank_table_serves_both_ends_of_every_window(n_events):
    params = HmmParams().as_array()
    table = flank_table(40, params)
    pre = np.empty(n_events, np.float32)
    post = np.empty(n_events, np.float32)
    clip_flanks(n_events, params, pre, post)
    assert pre.tobytes() == table[:n_events].tobytes()
    assert post.tobytes() == table[:n_events][::-1].tobytes()


def test_jobs_packed_to_batch_coordinates():
    # read 1 spans ref 100..160 and events 50..90; its window 5..30 has 25 bases, 20 6-mers
    job_read = np.array([1, 0], np.int64)
    w0, w1 = np.array([5, 0]), np.array([30, 12])
    e1, e2 = np.array([30, 3]), np.array([10, 9])
    ref_seq_off = np.array([0, 100, 160])
    ev_off = np.array([0, 50, 90])
    read, p_w0, length, p_e1, p_e2, cells, fits = pack_jobs(job_read, w0, w1, e1, e2, ref_seq_off, ev_off, 6, 16)
    assert read.tolist() == [1, 0] and read.dtype == np.int32
    assert p_w0.tolist() == [105, 0] and length.tolist() == [25, 12]
    assert p_e1.tolist() == [80, 3] and p_e2.tolist() == [60, 9]
    assert cells.tolist() == [20 * 21, 7 * 7]
    assert fits.tolist() == [False, True]
    assert launch_order(np.array([0, 1]), cells, True).tolist() == [0, 1]
    assert launch_order(np.array([1, 0]), cells, False).tolist() == [1, 0]


def test_launch_order_is_a_stable_sort_by_cost_descending():
    rng = np.random.default_rng(3)
    for n, top in ((0, 5), (1, 5), (500, 1), (500, 4), (3000, 5000), (3000, 2**40)):
        cells = rng.integers(0, top, n + 7)
        idx = rng.permutation(n + 7)[:n]
        got = launch_order(idx, cells, True)
        assert got.dtype == np.int32
        assert got.tolist() == idx[np.argsort(-cells[idx], kind="stable")].tolist()


def test_transitions_are_the_cpu_helpers():
    params = HmmParams().as_array()
    epb = np.array([1.7, 0.0, 2.3])
    trans = read_transitions(np.array([2, 0, 2]), epb, params)
    assert trans[0].tobytes() == block_transitions(1.7, params).tobytes()
    assert trans[2].tobytes() == block_transitions(2.3, params).tobytes()
    assert not trans[1].any()  # no jobs: never computed (its rate would divide by zero)


def test_disabled_or_absent_gpu_keeps_the_hmm_on_the_cpu(caplog, monkeypatch):
    assert open_gpu_hmm(CudaOptions(disable=True)) is None
    assert open_gpu_hmm(CudaOptions(hmm=False)) is None
    if _gpu_present():
        pytest.skip("a GPU is present")
    monkeypatch.setattr(streamer_gpu, "_said", set())  # as in a new process
    with caplog.at_level(logging.INFO, logger="streamer_gpu"):
        assert open_gpu_hmm(CudaOptions()) is None
        assert open_gpu_hmm(CudaOptions()) is None
    lines = [r for r in caplog.records if "HMM" in r.getMessage()]
    assert len(lines) == 1 and "the CpG HMM runs on the CPU" in lines[0].getMessage()
