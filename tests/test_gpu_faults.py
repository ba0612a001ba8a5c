"""A GPU that fails or is full loses no read: `streamer call` under the CUDA simulator with
CUDA errors injected (`STREAMER_CUDA_FAULT`) at start-up and in a batch, and with too little
device memory, writes the CPU's calls to the byte, each failure said in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ECOLI, REFERENCE
from test_gpu_abea import HAS_CUDA_MODULE

pytestmark = pytest.mark.skipif(not HAS_CUDA_MODULE, reason="neither numba-cuda nor numba's CUDA target is installed")

# the simulator's arena is allocated in host memory: batches small enough for a small one
SMALL_BATCHES = ("--max-bases", "200000")


def call(tmp_path, name: str, *extra, fault: str = "") -> tuple[subprocess.CompletedProcess, bytes]:
    reads = tmp_path / "reads.fasta"
    if not reads.exists():
        shutil.copy(ECOLI / "reads.fasta", reads)
    out = tmp_path / f"{name}.tsv"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", STREAMER_CUDA_FAULT=fault)
    proc = subprocess.run([sys.executable, "-m", "streamer", "call", "-r", reads, "-b", ECOLI / "reads.bam", "-g",
                           REFERENCE, "--signal", ECOLI / "fast5", "-o", out, "-t", "2", *SMALL_BATCHES, *extra],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc, out.read_bytes()


@pytest.fixture(scope="module")
def on_cpu(tmp_path_factory) -> bytes:
    return call(tmp_path_factory.mktemp("cpu"), "cpu", "--disable-cuda")[1]


def lines_with(stderr: str, text: str) -> list[str]:
    return [line for line in stderr.splitlines() if text in line]


def test_cuda_error_at_warm_up_runs_the_process_on_the_cpu(tmp_path, on_cpu):
    # the HMM's first launch, the warm-up's: where a process that found the GPU full ran out
    proc, calls = call(tmp_path, "warm", fault="hmm:1")
    assert calls == on_cpu
    assert len(lines_with(proc.stderr, "failed")) == 1
    assert lines_with(proc.stderr, "GPU 0 failed at start-up")[0].endswith("this process runs on the CPU")
    assert "CUDA_ERROR_OUT_OF_MEMORY" in proc.stderr


def test_cuda_error_in_a_batch_runs_that_batch_on_the_cpu(tmp_path, on_cpu):
    # ABEA's call 1 is the warm-up's; every later one (the batches of reads) fails, so that no batch
    # runs in the simulator, which takes minutes for a batch of real reads
    proc, calls = call(tmp_path, "batch", fault=",".join(f"abea:{n}" for n in range(2, 40)))
    assert calls == on_cpu
    failed = lines_with(proc.stderr, "failed")
    assert failed and all("GPU 0 failed in the abea stage of a batch of" in line and
                          line.endswith("the rest of the batch runs on the CPU") for line in failed)
    assert "Traceback" not in proc.stderr


def test_too_little_gpu_memory_runs_the_process_on_the_cpu(tmp_path, on_cpu):
    proc, calls = call(tmp_path, "small", "--cuda-mem-frac", "0.01")
    assert calls == on_cpu
    said = lines_with(proc.stderr, "too little free memory on GPU 0")
    assert len(said) == 1 and said[0].endswith("this process runs on the CPU")
