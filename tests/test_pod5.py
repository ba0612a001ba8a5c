"""POD5 reading: same reads and pA bits as the FAST5 route, real dorado files, clean errors."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np
import pod5 as pod5_lib
import pytest

from conftest import ECOLI
from streamer.errors import InputError
from streamer.io.fast5 import iter_fast5
from streamer.io.poretype import run_metadata
from streamer.pipeline.chemistry import pore_of_file
from streamer.io.pod5 import SIGNATURE, iter_pod5, pod5_is_complete, pod5_read_ids, read_pod5, read_pod5_many, write_pod5

DORADO = Path("/work/shared/data/formats/pod5_dorado/chr1_MAT.pod5")
needs_dorado = pytest.mark.skipif(not DORADO.is_file(), reason="shared POD5 sample absent")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def mapped(path: Path) -> bool:
    return str(path) in Path("/proc/self/maps").read_text()


def unmapped(path: Path, within: float = 10.0) -> bool:
    """Whether the file's mapping goes: once the reader is closed, one of pod5's own threads drops it a
    moment later (milliseconds when idle, longer on a busy machine); a leak never lets it go."""
    deadline = time.monotonic() + within
    while mapped(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture(scope="module")
def fast5_records():
    return [rec for path in sorted((ECOLI / "fast5").glob("*.fast5")) for rec in iter_fast5(path)]


@pytest.fixture(scope="module")
def ecoli_pod5(tmp_path_factory, fast5_records) -> Path:
    path = tmp_path_factory.mktemp("pod5") / "ecoli.pod5"
    assert write_pod5(path, fast5_records) == len(fast5_records) == 8
    return path


@pytest.fixture(autouse=True)
def no_leaked_handles():
    before = open_fds()
    yield
    gc.collect()  # a caught exception's traceback is a reference cycle that holds frames
    assert open_fds() == before


def test_reads_match_fast5_route(ecoli_pod5, fast5_records):
    assert pod5_read_ids(ecoli_pod5) == [r.read_id for r in fast5_records]
    for got, want in zip(iter_pod5(ecoli_pod5), fast5_records, strict=True):
        assert got.read_id == want.read_id
        assert got.sample_rate == want.sample_rate == 4000.0
        assert np.array_equal(got.raw, want.raw)
        assert got.to_pa().tobytes() == want.to_pa().tobytes()
        by_id = read_pod5(ecoli_pod5, want.read_id)
        assert by_id.to_pa().tobytes() == want.to_pa().tobytes()
    assert unmapped(ecoli_pod5)


def test_pa_equals_pod5s_own_calibration(ecoli_pod5):
    with pod5_lib.Reader(ecoli_pod5) as reader:
        theirs = {str(r.read_id): r.signal_pa for r in reader.reads()}
    for rec in iter_pod5(ecoli_pod5):
        assert rec.to_pa().tobytes() == theirs[rec.read_id].tobytes()
        assert rec.digitisation == 8192.0  # from the run's ADC span, as `pod5 convert fast5` writes it


def test_read_many_skips_absent_ids(ecoli_pod5, fast5_records):
    wanted = [fast5_records[5].read_id, "00000000-0000-0000-0000-000000000000", "not-a-uuid", fast5_records[1].read_id]
    got = [r.read_id for r in read_pod5_many(ecoli_pod5, wanted)]
    assert sorted(got) == sorted([fast5_records[1].read_id, fast5_records[5].read_id])


def test_missing_read_names_the_read(ecoli_pod5):
    with pytest.raises(InputError, match="read not found") as err:
        read_pod5(ecoli_pod5, "00000000-0000-0000-0000-000000000000")
    assert err.value.read_id == "00000000-0000-0000-0000-000000000000"


def test_abandoned_iterator_releases_the_file(ecoli_pod5):
    it = iter_pod5(ecoli_pod5)
    next(it)
    it.close()
    gc.collect()  # the record just dropped may sit in a reference cycle with arrow's buffers
    assert unmapped(ecoli_pod5)


@needs_dorado
def test_real_dorado_file():
    (rec,) = iter_pod5(DORADO)
    assert rec.read_id == "0dafc6aa-3aa0-44d1-b7f9-7af619cce611" == pod5_read_ids(DORADO)[0]
    assert rec.sample_rate == 5000.0 and len(rec.raw) == 107168
    assert rec.digitisation == 2048.0 and rec.offset == -285.0
    with pod5_lib.Reader(DORADO) as reader:
        assert rec.to_pa().tobytes() == next(reader.reads()).signal_pa.tobytes()
    assert read_pod5(DORADO, rec.read_id).to_pa().tobytes() == rec.to_pa().tobytes()
    assert pod5_is_complete(DORADO)


def _all_calls(path: Path, read_id: str = "x"):
    return (pod5_read_ids, lambda p: list(iter_pod5(p)), lambda p: read_pod5(p, read_id))


def test_truncated_file(tmp_path, ecoli_pod5):
    data = ecoli_pod5.read_bytes()
    path = tmp_path / "truncated.pod5"
    path.write_bytes(data[: len(data) // 2])
    assert not pod5_is_complete(path) and pod5_is_complete(ecoli_pod5)
    for call in _all_calls(path):
        with pytest.raises(InputError, match="truncated POD5 file") as err:
            call(path)
        assert err.value.path == str(path)


def test_not_pod5(tmp_path):
    path = tmp_path / "random.pod5"
    path.write_bytes(np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    for call in _all_calls(path):
        with pytest.raises(InputError, match="not a POD5 file"):
            call(path)
    with pytest.raises(InputError, match="no such file"):
        pod5_read_ids(tmp_path / "absent.pod5")
    with pytest.raises(InputError, match="directory"):
        pod5_read_ids(tmp_path)


def test_corrupt_footer(tmp_path, ecoli_pod5):
    data = bytearray(ecoli_pod5.read_bytes())
    footer_end = len(data) - len(SIGNATURE) - 16  # before the closing section marker and signature
    data[footer_end - 48 : footer_end] = b"\xff" * 48
    path = tmp_path / "bad_footer.pod5"
    path.write_bytes(bytes(data))
    for call in _all_calls(path):
        with pytest.raises(InputError, match="cannot open as POD5") as err:
            call(path)
        assert err.value.__cause__ is not None


def test_corrupt_compressed_signal(tmp_path, ecoli_pod5, fast5_records):
    data = bytearray(ecoli_pod5.read_bytes())
    frame = data.index(b"\x28\xb5\x2f\xfd")  # first zstd frame: the first read's first signal chunk
    data[frame : frame + 4] = b"\0\0\0\0"
    path = tmp_path / "bad_signal.pod5"
    path.write_bytes(bytes(data))
    first = fast5_records[0].read_id
    assert pod5_read_ids(path)[0] == first  # listing needs no signal
    with pytest.raises(InputError, match="unreadable read") as err:
        list(iter_pod5(path))
    assert err.value.read_id == first and err.value.path == str(path)
    with pytest.raises(InputError, match="unreadable read"):
        read_pod5(path, first)
    assert read_pod5(path, fast5_records[3].read_id).read_id == fast5_records[3].read_id


def test_a_fast5_runs_metadata_names_its_pore_in_the_pod5_written(tmp_path, fast5_records):
    """A FAST5 run keeps its flow cell and kit in `tracking_id`/`context_tags` (here only in the protocol
    script's name); written as POD5 (a replay, the benchmarks' data) they stay there, so the POD5 names
    the pore as the FAST5 did."""
    source = sorted((ECOLI / "fast5").glob("*.fast5"))[0]
    run = run_metadata(source)
    assert "FLO-MIN106" in run["exp_script_name"] and pore_of_file(source) == "r9"
    path = tmp_path / "run.pod5"
    write_pod5(path, fast5_records[:2], run=run)
    assert run_metadata(path) == run and pore_of_file(path) == "r9"
    bare = tmp_path / "bare.pod5"
    write_pod5(bare, fast5_records[:2])
    assert run_metadata(bare) == {} and pore_of_file(bare) is None
