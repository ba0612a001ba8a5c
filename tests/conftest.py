"""Shared fixtures: the small E. coli fixture shipped in tests/data, and ../shared when present."""

from __future__ import annotations

import sys
from pathlib import Path

# The checkout's code is what is tested, whichever way the project is installed: its three
# import roots go first on the path (an installed copy would otherwise shadow gpu/ and plugins/).
ROOT = Path(__file__).resolve().parents[1]
for root in (ROOT / "plugins", ROOT / "gpu", ROOT):
    if str(root) not in sys.path[:3]:
        sys.path.insert(0, str(root))

import pytest  # noqa: E402

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


@pytest.fixture
def reference_copy(tmp_path) -> Path:
    """The reference with its FM-index, copied into tmp_path: for a test whose aligner may write beside the
    reference (an index built again, the `auto` engine's kept check), as none may write into tests/data."""
    for src in (REFERENCE, REFERENCE.with_name(REFERENCE.name + ".fmi")):
        (tmp_path / src.name).write_bytes(src.read_bytes())
    return tmp_path / REFERENCE.name


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """`streamer.cli.main` sets up logging for a process; in tests one call must not leave its
    handler and levels to the next test."""
    import logging

    names = ("streamer", "streamer_gpu", "streamer_plugins")
    root = logging.getLogger()
    saved = root.handlers[:], root.level, [logging.getLogger(n).level for n in names]
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in zip(names, saved[2]):
        logging.getLogger(name).setLevel(level)
