"""Shared fixtures: the small E. coli fixture shipped in tests/data, and ../shared when present."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
ECOLI = DATA / "ecoli"
REFERENCE = DATA / "ecoli_k12_mg1655.fa.gz"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "ecoli_2kb_region"
READ1 = "fa9ad683-35c5-4dad-a3af-de7a86b1ffa8"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared data not present")


@pytest.fixture(scope="session")
def ecoli() -> Path:
    return ECOLI


@pytest.fixture(scope="session")
def reference_path() -> Path:
    return REFERENCE
