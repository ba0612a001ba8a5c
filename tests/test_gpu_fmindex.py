"""The FM-index built on the GPU and seeding on it: the CPU's index bytes (in one piece and in several)
and the CPU's seeds, under numba's CUDA simulator (and on a GPU when there is one); a CUDA error seeds
on the CPU; without a GPU both run on the CPU."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from streamer.align import fmindex as F
from streamer.align.seeds import find_seeds

from test_gpu_abea import run_cases

CASES = Path(__file__).parent / "gpu_fmindex_cases.py"


@pytest.fixture(scope="module", params=["simulator", "gpu"])
def cases(request) -> dict:
    return run_cases(request.param, CASES)


def test_index_built_on_the_gpu_is_the_cpus(cases):
    assert cases["index"] == {"same": True, "n": 2164}
    assert cases["index_pieces"]["same"] and cases["index_pieces"]["pieces"] >= 3
    if "ecoli_index" in cases:
        assert cases["ecoli_index"] == {"same": True, "n": 4641653}


@pytest.mark.parametrize("name", ["seeds", "seeds_capped_chunked", "no_reads"])
def test_seeds_on_the_gpu_are_the_cpus(cases, name):
    assert cases[name]["same"]
    assert cases[name]["n_seeds"] > 100 or name == "no_reads"


def test_ecoli_seeds_on_the_gpu(cases):
    if "ecoli_seeds" not in cases:
        pytest.skip("the E. coli case runs on a GPU only")
    assert cases["ecoli_seeds"]["same"] and cases["ecoli_seeds"]["n_seeds"] > 1000


def test_a_cuda_error_seeds_on_the_cpu(cases):
    assert cases["fault"] == {"same": True}


def test_without_a_gpu_both_run_on_the_cpu(tmp_path, monkeypatch, caplog):
    import streamer_gpu

    monkeypatch.setattr(streamer_gpu, "gpu_absent", lambda stage: True)
    ref = tmp_path / "ref.fa"
    ref.write_text(">a\n" + "ACGTTGCAAGGCTTAACCGGTATAGCGCATTA" * 20 + "\n")
    with caplog.at_level(logging.INFO):
        index = F.load_or_build(ref, target="gpu")
    assert "built on the CPU" in caplog.text
    codes = F.encode("TTGCAAGGCTTAACCGGTATAGCGC")
    seeds = find_seeds(index, codes, np.array([0, len(codes)]), target="gpu")
    assert len(seeds) == 20 and not seeds.rc.any()
