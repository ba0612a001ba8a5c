"""Reader processes hand their samples back through files under /dev/shm: the same samples as read in
place, and no file left after a run, a reader killed mid-task, or an owner killed."""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import time
from functools import partial

import numpy as np
import pytest

from conftest import ECOLI, REFERENCE, ROOT
from streamer.pipeline import shared_samples, signal_pool
from streamer.io.signal_chunks import load_chunk
from streamer.io.signal import find_signal_files, signal_read_ids

needs_shm = pytest.mark.skipif(not os.access(shared_samples.SHM, os.W_OK), reason="no writable /dev/shm")
WAIT = 60  # seconds: generous, for a loaded machine


@pytest.fixture(scope="module")
def tasks():
    files = find_signal_files([ECOLI / "fast5"])[:12]
    return signal_pool.read_tasks({path: signal_read_ids(path) for path in files}, 4)


def _mapped(raw: np.ndarray) -> bool:
    return isinstance(raw.base, memoryview) and isinstance(raw.base.obj, mmap.mmap)


def _same(got, expected) -> None:
    assert got.read_ids == expected.read_ids and got.errors == expected.errors
    assert got.raw.dtype == np.int16 and got.raw.tobytes() == expected.raw.tobytes()
    for name in ("start", "length", "calibration"):
        assert np.array_equal(getattr(got, name), getattr(expected, name)), name


def _wait_for(check, what: str) -> None:
    end = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


@needs_shm
def test_samples_come_mapped_from_shm_as_read_in_place_and_leave_no_file(tasks):
    pool = signal_pool.signal_readers([".fast5"], 2, "processes")
    try:
        chunks = [f.result() for f in [pool.submit(load_chunk, task) for task in tasks]]
        for task, got in zip(tasks, chunks):
            assert _mapped(got.raw) and got.raw.flags.writeable
            _same(got, load_chunk(task))
        assert pool.shared.left() == []  # each unlinked as it was mapped
    finally:
        pool.shutdown()
    assert pool.shared.left() == []


def test_where_no_file_takes_them_the_samples_come_through_the_pipe(tasks, tmp_path):
    assert shared_samples.place(tmp_path / "missing") is None
    pool = signal_pool.ReaderProcesses(1, shared_samples.SharedFiles(tmp_path / "missing", "streamer-1-0a1b2c3d-"))
    try:
        got = pool.submit(load_chunk, tasks[0]).result()  # the reader's file cannot be made
    finally:
        pool.shutdown()
    assert not _mapped(got.raw)
    _same(got, load_chunk(tasks[0]))
    small = shared_samples.place(tmp_path)
    assert shared_samples.write(small, np.zeros(shared_samples.MIN_BYTES // 2 - 1, np.int16)) is None  # a few reads
    assert small.left() == []


@needs_shm
def test_the_file_of_a_reader_killed_mid_task_is_removed_at_shutdown():
    pool = signal_pool.signal_readers([".fast5"], 1, "processes")
    try:
        reader = pool.submit(os.getpid).result()
        # a reader's file that its owner never took: as if the reader died before sending its name
        path = pool.submit(partial(shared_samples.write, pool.shared), np.arange(1 << 16, dtype=np.int16)).result()
        assert os.path.exists(path) and pool.shared.left() != []
        os.kill(reader, signal.SIGKILL)
    finally:
        pool.shutdown(wait=True)
    assert not os.path.exists(path) and pool.shared.left() == []


_OWNER = """
import os, signal, sys
sys.path[:0] = sys.argv[1:]
import numpy as np
from functools import partial
from streamer.pipeline import shared_samples
from streamer.pipeline.signal_pool import signal_readers
pool = signal_readers([".fast5"], 1, "processes")
print(pool.submit(partial(shared_samples.write, pool.shared), np.ones(1 << 16, np.int16)).result(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@needs_shm
def test_a_reader_whose_owner_is_killed_removes_the_files_it_made():
    proc = subprocess.Popen([sys.executable, "-c", _OWNER, str(ROOT / "plugins"), str(ROOT / "gpu"), str(ROOT)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    path = proc.stdout.readline().strip()
    assert proc.wait(WAIT) == -signal.SIGKILL and path.startswith(f"{shared_samples.SHM}/streamer-{proc.pid}-")
    proc.stdout.close()
    _wait_for(lambda: not os.path.exists(path), f"the reader to remove {path}")


def test_a_new_pool_removes_the_files_of_owners_that_died(tmp_path):
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    dead, alive = tmp_path / f"streamer-{ended.pid}-0a1b2c3d-7-0", tmp_path / f"streamer-{os.getpid()}-0a1b2c3d-7-0"
    other = tmp_path / "streamer-data.bin"  # not a pool's
    for path in (dead, alive, other):
        path.write_bytes(b"x")
    files = shared_samples.place(tmp_path)
    assert files.prefix.startswith(f"streamer-{os.getpid()}-")
    assert not dead.exists() and alive.exists() and other.exists()


@needs_shm
def test_a_call_through_reader_processes_leaves_nothing_in_shm(tmp_path):
    out = tmp_path / "meth.tsv"
    proc = subprocess.Popen([sys.executable, "-m", "streamer", "call", "-r", str(ECOLI / "reads.fasta"), "-b",
                             str(ECOLI / "reads.bam"), "-g", str(REFERENCE), "--signal", str(ECOLI / "fast5"), "-o",
                             str(out), "-t", "2", "-K", "16", "--io-mode", "processes"],
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "calls written:    790" in err
    assert not [p for p in os.listdir(shared_samples.SHM) if p.startswith(f"streamer-{proc.pid}-")]
