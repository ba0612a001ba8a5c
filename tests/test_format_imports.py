"""`streamer call`'s main process imports the library of its own signal format only (h5py for FAST5, pod5
and pyarrow for POD5, pyslow5 for BLOW5): each is imported as a file of its format is first opened, so a
module-level import of one of them, anywhere `call` imports, fails here.

Each case runs in a fresh interpreter what the command's main process does with the signal files
before its readers take over: its modules imported as `streamer call` imports them, the signal index
built (every file opened) or loaded from its cache, the pore told from the first file's run metadata,
and one reader task's reads loaded in this process (as reader threads do). On a cached index, nothing
before the reading imports a format's library (the index keeps the metadata that tells the pore).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamer.io.fast5 import iter_fast5
from streamer.io.pod5 import write_pod5
from streamer.io.slow5 import write_blow5

ECOLI = Path(__file__).parent / "data" / "ecoli"
LIBRARIES = ("h5py", "pod5", "pyarrow", "pyslow5")
RUN = {"flow_cell_product_code": "FLO-MIN106", "sequencing_kit": "SQK-LSK108"}  # the FAST5 files' run

MAIN_PROCESS = """
import sys
from streamer.cli import build_parser
from streamer.commands._inputs import pore_of_inputs, signal_index
from streamer.io.signal_chunks import load_chunk
from streamer.pipeline.signal_pool import read_tasks

args = build_parser("call").parse_args(["call", "-r", sys.argv[1], "-b", sys.argv[2], "-g", sys.argv[3],
                                        "--signal", sys.argv[4]])
index = signal_index(args)
assert len(index) == 8 and not index.bad_files, (len(index), index.bad_files)
pore, _ = pore_of_inputs(args, index)
loaded = lambda: " ".join(sorted(m for m in %r if m in sys.modules))
print(pore)
print(loaded())
wanted = {}
for read_id, path in index.paths.items():
    wanted.setdefault(path, []).append(read_id)
assert len(load_chunk(read_tasks(wanted, 32)[0]).read_ids) == 8
print(loaded())
""" % (LIBRARIES,)


@pytest.fixture(scope="module")
def signal_dirs(tmp_path_factory) -> dict[str, Path]:
    """The fixture's eight reads as FAST5 (the shipped files), one POD5 and one BLOW5 file, each naming the
    R9.4.1 flow cell and kit."""
    records = [rec for f in sorted((ECOLI / "fast5").glob("*.fast5")) for rec in iter_fast5(f)]
    dirs = {"fast5": ECOLI / "fast5"}
    for fmt, write in (("pod5", write_pod5), ("blow5", write_blow5)):
        dirs[fmt] = tmp_path_factory.mktemp(fmt)
        write(dirs[fmt] / f"reads.{fmt}", records, RUN)
    return dirs


@pytest.mark.parametrize("fmt, loaded", [("fast5", "h5py"), ("pod5", "pod5 pyarrow"), ("blow5", "pyslow5")])
def test_a_run_imports_its_own_formats_library_only(fmt, loaded, signal_dirs, tmp_path):
    reads = tmp_path / "reads.fasta"  # the index is cached beside it
    shutil.copyfile(ECOLI / "reads.fasta", reads)

    def main_process() -> list[str]:
        out = subprocess.run([sys.executable, "-c", MAIN_PROCESS, str(reads), str(ECOLI / "reads.bam"),
                              str(ECOLI.parent / "ecoli_k12_mg1655.fa.gz"), str(signal_dirs[fmt])],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.splitlines()[-3:]

    assert main_process() == ["r9", loaded, loaded]  # the index built: every file opened
    assert main_process() == ["r9", "", loaded]  # the index and the pore from the cache


def test_the_readers_fork_server_preloads_the_runs_formats():
    from streamer.io.signal import SIGNAL_SUFFIXES, reader_libraries

    assert reader_libraries([".pod5"]) == ["pod5"]
    assert reader_libraries({".fast5", ".FAST5"}) == ["h5py", "vbz_h5py_plugin"]
    assert reader_libraries([".blow5", ".slow5", ".txt"]) == ["pyslow5"]
    assert reader_libraries(SIGNAL_SUFFIXES) == ["h5py", "pod5", "pyslow5", "vbz_h5py_plugin"]


def test_a_reader_process_imports_no_numba():
    """What the readers' fork server preloads and a reader task runs (`streamer.io.signal_chunks`) stays
    clear of numba, whose import alone held the first batch's reads back by half a second on a GPU box."""
    code = ("import sys, streamer.pipeline.fork_server, streamer.pipeline.signal_pool, streamer.io.signal_chunks; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"
