"""GPU event detection: the CPU's events to the bit under numba's CUDA simulator (and on a GPU when
there is one), on the fixture reads and edge cases; its fallbacks; and `streamer call` writing the
CPU's calls to the byte with the GPU events path on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from streamer_gpu.events import chunk_bounds
from conftest import ECOLI, REFERENCE
from test_gpu_abea import HAS_CUDA_MODULE, run_cases
from test_gpu_faults import lines_with

CASES = Path(__file__).parent / "gpu_events_cases.py"
# the fixture's three shortest reads (26,342 samples): the simulator runs each GPU thread in Python
SHORT_READS = ("2c469631-125c-4046-b1c0-677322b0f3a3", "b098b785-7ccd-41af-8980-f2894d700284",
               "c75c8f96-eb4b-4465-9d43-024209a6a35a")  # fmt: skip
needs_cuda_module = pytest.mark.skipif(not HAS_CUDA_MODULE, reason="neither numba-cuda nor numba's CUDA target is installed")


@pytest.fixture(scope="module", params=["simulator", "gpu"])
def cases(request) -> dict:
    return run_cases(request.param, CASES)


@pytest.mark.parametrize("name", ["fixture_dna", "fixture_rna", "edges_dna", "edges_rna", "edges_odd_windows", "chunked",
                                  "means_only"])  # fmt: skip
def test_gpu_events_identical_to_cpu(cases, name):
    case = cases[name]
    assert case == {"same": True, "n_events": case["n_events"], "on_gpu": True, "fallback": ""}
    assert case["n_events"] > 30


def test_empty_batch_has_no_events(cases):
    assert cases["empty_batch"]["same"] and cases["empty_batch"]["n_events"] == 0


def test_windows_longer_than_the_kernels_run_on_the_cpu(cases):
    case = cases["long_windows"]
    assert case["same"] and not case["on_gpu"] and "longer than the GPU kernel's" in case["fallback"]


def test_cuda_error_detects_the_batch_on_the_cpu(cases):
    case = cases["fault"]
    assert case["same"] and not case["on_gpu"] and "CUDA_ERROR_OUT_OF_MEMORY" in case["fallback"]


def test_chunks_hold_at_most_the_cap_or_one_read():
    off = np.cumsum([0, 400, 300, 2000, 100, 100, 700])
    assert chunk_bounds(off, 1000) == [0, 2, 3, 6]
    assert chunk_bounds(off, 10_000) == [0, 6]
    assert chunk_bounds(np.zeros(1, np.int64), 1000) == [0]


def call(tmp_path, name: str, *extra, fault: str = "") -> tuple[subprocess.CompletedProcess, bytes]:
    """`streamer call` on SHORT_READS, a batch each, under the CUDA simulator; its calls TSV."""
    reads = tmp_path / "reads.fasta"
    if not reads.exists():
        records = ECOLI.joinpath("reads.fasta").read_text().split(">")[1:]
        reads.write_text("".join(">" + r for r in records if r.split()[0] in SHORT_READS))
    out = tmp_path / f"{name}.tsv"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", STREAMER_CUDA_FAULT=fault)
    proc = subprocess.run([sys.executable, "-m", "streamer", "call", "-r", reads, "-b", ECOLI / "reads.bam", "-g",
                           REFERENCE, "--signal", ECOLI / "fast5", "-o", out, "-t", "2", "--max-bases", "1200", *extra],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc, out.read_bytes()


@needs_cuda_module
def test_call_with_gpu_events_writes_the_cpus_calls(tmp_path):
    # ABEA's batches fail on purpose (its call 1 is the warm-up's) so that only events run on the
    # simulated GPU; they run ahead on the front lane, whose part counts its own calls from the first
    # batch of reads: its call 2 fails, so that batch's events come from the CPU, said in one line, the
    # other batch's from the GPU
    faults = ",".join(f"abea:{n}" for n in range(2, 40)) + ",events:2"
    on_cpu = call(tmp_path, "cpu", "--disable-cuda")[1]
    assert on_cpu.count(b"\n") > 10
    proc, calls = call(tmp_path, "gpu", "--cuda-events", fault=faults)
    assert calls == on_cpu
    said = lines_with(proc.stderr, "GPU event detection failed on a batch of")
    assert len(said) == 1 and said[0].endswith("its events are detected on the CPU")
