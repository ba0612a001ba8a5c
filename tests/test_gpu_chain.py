"""Chaining on the GPU: the CPU's chains, every field, under numba's CUDA simulator (and on a GPU when there is
one), for simulated reads, crafted anchors (contigs, the band, strands, a tandem array's ties) and settings
that end the predecessor search in every way; a CUDA error chains on the CPU; without a GPU the CPU chains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamer.align.anchors import Seeds
from streamer.align.chain import chain

from test_gpu_abea import run_cases

CASES = Path(__file__).parent / "gpu_chain_cases.py"


@pytest.fixture(scope="module", params=["simulator", "gpu"])
def cases(request) -> dict:
    return run_cases(request.param, CASES, "--small")


@pytest.mark.parametrize("name", ["crafted", "reads", "tight", "no_seeds"])
def test_chains_on_the_gpu_are_the_cpus(cases, name):
    case = cases[name]
    assert case["same"]
    assert case["n_chains"] >= 5 or name == "no_seeds"


def test_tight_settings_change_the_chains(cases):
    assert cases["tight"]["n_chains"] != cases["reads"]["n_chains"]


def test_a_cuda_error_chains_on_the_cpu(cases):
    assert cases["fault"] == {"same": True}


def test_without_a_gpu_the_cpu_chains(monkeypatch):
    import streamer_gpu

    monkeypatch.setattr(streamer_gpu, "gpu_absent", lambda stage: True)
    seeds = Seeds(np.zeros(3, np.int32), np.array([0, 100, 200], np.int32), np.array([1000, 1100, 1205]),
                  np.full(3, 30, np.int32), np.zeros(3, bool))
    cpu = chain(seeds, np.array([300]), np.array([0, 5000]))
    gpu = chain(seeds, np.array([300]), np.array([0, 5000]), target="gpu")
    assert list(gpu.score) == list(cpu.score) == [88] and list(gpu.anchors) == [0, 1, 2]
