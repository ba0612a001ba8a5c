"""Base-level extension on the GPU: the CPU's CIGARs, spans, scores and NM under numba's CUDA simulator
(and on a GPU when there is one), in several launches with the largest jobs on the CPU, after a CUDA
error, and without a GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamer.align.bases import decode
from streamer.align.engine import SeedAligner
from streamer.io.alignments import AlignmentFilter

from align_seeder import KmerSeeder
from test_gpu_abea import run_cases

CASES = Path(__file__).parent / "gpu_extend_cases.py"


@pytest.fixture(scope="module", params=["simulator", "gpu"])
def cases(request) -> dict:
    return run_cases(request.param, CASES, "--small")


@pytest.mark.parametrize("profile", ["r9", "r10"])
def test_gpu_alignments_are_the_cpus(cases, profile):
    case = cases[profile]
    assert case["same"]
    assert case["chains"] >= 8 and case["jobs"] > 50 and case["cigar_runs"] > 10
    assert case["jobs_on_cpu"] == 0 and case["launches"] == 1


def test_jobs_split_over_launches_and_the_cpu(cases):
    case = cases["split"]
    assert case["same"] and case["launches"] >= 2 and 0 < case["jobs_on_cpu"] < case["jobs"]


def test_a_cuda_error_aligns_on_the_cpu(cases):
    assert cases["fault"] == {"same": True}


def test_without_a_gpu_the_gpu_engine_extends_on_the_cpu(monkeypatch):
    import streamer_gpu

    monkeypatch.setattr(streamer_gpu, "gpu_absent", lambda stage: True)
    assert streamer_gpu.extender(np.zeros(10, np.uint8)) is None
    contigs = [("c", np.random.default_rng(3).integers(0, 4, 20_000).astype(np.uint8))]
    read = contigs[0][1][5000:6000].copy()
    read[100::100] = (read[100::100] + 1) % 4  # 9 mismatches, 10 seeds
    aligner = SeedAligner(contigs, KmerSeeder.of(contigs, k=15), AlignmentFilter(), target="gpu")
    rec = aligner.records("r", decode(read))[0]
    assert (rec.cigartuples, rec.reference_start, rec.get_tag("NM")) == ([(0, 1000)], 5000, 9)
