"""SLOW5/BLOW5 reading: same reads and pA bits as the FAST5 route, a real slow5tools file,
the index kept out of the data folder, and clean errors (never a crash) on bad files."""

from __future__ import annotations

import gc
import os
import struct
from pathlib import Path

import numpy as np
import pyslow5
import pytest

from conftest import ECOLI
from streamer.errors import InputError
from streamer.io.fast5 import iter_fast5
from streamer.io.slow5 import (
    BLOW5_EOF,
    iter_slow5,
    read_slow5,
    read_slow5_many,
    slow5_is_complete,
    slow5_read_ids,
    write_blow5,
)

REAL = Path("/work/shared/data/formats/blow5_slow5tools/na12878_prom_merged_r9.4.1_chr22_read1.blow5")
needs_real = pytest.mark.skipif(not REAL.is_file(), reason="shared BLOW5 sample absent")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def index_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "slow5-index"
    monkeypatch.setenv("STREAMER_SLOW5_INDEX_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def no_leaked_handles():
    before = open_fds()
    yield
    gc.collect()  # a caught exception's traceback is a reference cycle that holds frames
    assert open_fds() == before


@pytest.fixture(scope="module")
def fast5_records():
    return [rec for path in sorted((ECOLI / "fast5").glob("*.fast5")) for rec in iter_fast5(path)]


@pytest.fixture(scope="module")
def ecoli_blow5(tmp_path_factory, fast5_records) -> Path:
    path = tmp_path_factory.mktemp("blow5") / "ecoli.blow5"
    assert write_blow5(path, fast5_records) == 8
    return path


@pytest.fixture(scope="module")
def ecoli_slow5_text(tmp_path_factory, fast5_records) -> Path:
    path = tmp_path_factory.mktemp("slow5") / "ecoli.slow5"
    s5 = pyslow5.Open(str(path), "w")
    s5.write_header({key: "" for key in s5.get_empty_header()})
    for rec in fast5_records[:3]:
        row = s5.get_empty_record()
        row.update(read_id=rec.read_id, digitisation=rec.digitisation, offset=rec.offset, range=rec.range,
                   sampling_rate=rec.sample_rate, len_raw_signal=len(rec.raw), signal=rec.raw)
        s5.write_record(row)
    s5.close()
    return path


def test_blow5_matches_fast5_route(ecoli_blow5, fast5_records):
    assert slow5_read_ids(ecoli_blow5) == [r.read_id for r in fast5_records]
    for got, want in zip(iter_slow5(ecoli_blow5), fast5_records, strict=True):
        assert got.read_id == want.read_id
        assert (got.digitisation, got.offset, got.range, got.sample_rate) == (
            want.digitisation, want.offset, want.range, want.sample_rate)
        assert got.to_pa().tobytes() == want.to_pa().tobytes()
        assert read_slow5(ecoli_blow5, want.read_id).to_pa().tobytes() == want.to_pa().tobytes()


def test_slow5_text_matches_fast5_route(ecoli_slow5_text, fast5_records):
    want = fast5_records[:3]
    assert slow5_read_ids(ecoli_slow5_text) == [r.read_id for r in want]
    for got, rec in zip(iter_slow5(ecoli_slow5_text), want, strict=True):
        assert got.to_pa().tobytes() == rec.to_pa().tobytes() and got.sample_rate == rec.sample_rate
    assert np.array_equal(read_slow5(ecoli_slow5_text, want[2].read_id).raw, want[2].raw)


def test_read_many_in_asked_order_skipping_absent(ecoli_blow5, fast5_records):
    wanted = [fast5_records[6].read_id, "absent", fast5_records[2].read_id]
    assert [r.read_id for r in read_slow5_many(ecoli_blow5, wanted)] == [wanted[0], wanted[2]]
    with pytest.raises(InputError, match="read not found") as err:
        read_slow5(ecoli_blow5, "absent")
    assert err.value.read_id == "absent"


def test_index_cached_outside_the_data_folder(tmp_path, index_dir, fast5_records):
    data = tmp_path / "run"
    data.mkdir()
    path = data / "reads.blow5"
    write_blow5(path, fast5_records[:2])
    read_slow5(path, fast5_records[0].read_id)
    assert sorted(p.name for p in data.iterdir()) == ["reads.blow5"]
    (first,) = index_dir.glob("*.idx")
    slow5_read_ids(path)
    assert list(index_dir.glob("*.idx")) == [first]  # reused
    write_blow5(path, fast5_records[2:5])  # the file changes: a new index, the stale one removed
    os.utime(path, ns=(0, 10**18))
    assert slow5_read_ids(path) == [r.read_id for r in fast5_records[2:5]]
    (second,) = index_dir.glob("*.idx")
    assert second != first


def test_unwritable_index_folder_falls_back_to_memory(tmp_path, monkeypatch, ecoli_blow5, fast5_records):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("STREAMER_SLOW5_INDEX_DIR", str(blocker / "sub"))
    assert slow5_read_ids(ecoli_blow5) == [r.read_id for r in fast5_records]


@needs_real
def test_real_slow5tools_file():
    before = sorted(os.listdir(REAL.parent))
    (rec,) = iter_slow5(REAL)
    assert rec.read_id == "0000e160-9cde-4eea-9c13-3ace79ef074f" == slow5_read_ids(REAL)[0]
    assert (rec.digitisation, rec.offset, rec.sample_rate, len(rec.raw)) == (2048.0, -212.0, 4000.0, 146215)
    assert np.array_equal(read_slow5(REAL, rec.read_id).raw, rec.raw)
    theirs = next(pyslow5.Open(str(REAL), "r").seq_reads())  # sequential: pyslow5 writes no index
    assert np.array_equal(theirs["signal"], rec.raw) and theirs["range"] == rec.range
    assert sorted(os.listdir(REAL.parent)) == before  # no index written beside the data
    assert slow5_is_complete(REAL)


def _all_calls(read_id: str = "x"):
    return (slow5_read_ids, lambda p: list(iter_slow5(p)), lambda p: read_slow5(p, read_id))


def test_truncated_files(tmp_path, ecoli_blow5, ecoli_slow5_text):
    for src, name, message in ((ecoli_blow5, "cut.blow5", "truncated BLOW5"), (ecoli_slow5_text, "cut.slow5", "truncated SLOW5")):
        data = src.read_bytes()
        path = tmp_path / name
        path.write_bytes(data[: len(data) // 2 + 3])
        assert not slow5_is_complete(path) and slow5_is_complete(src)
        for call in _all_calls():
            with pytest.raises(InputError, match=message) as err:
                call(path)
            assert err.value.path == str(path)


def test_not_slow5(tmp_path):
    path = tmp_path / "random.blow5"
    path.write_bytes(np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    for call in _all_calls():
        with pytest.raises(InputError, match="not a SLOW5/BLOW5 file"):
            call(path)
    with pytest.raises(InputError, match="no such file"):
        slow5_read_ids(tmp_path / "absent.blow5")
    with pytest.raises(InputError, match="directory"):
        slow5_read_ids(tmp_path)


def test_malformed_header(tmp_path, ecoli_blow5):
    data = bytearray(ecoli_blow5.read_bytes())
    data[64:68] = struct.pack("<I", 3)  # ASCII header length: far too short
    path = tmp_path / "bad_header.blow5"
    path.write_bytes(bytes(data))
    for call in _all_calls():
        with pytest.raises(InputError, match="cannot open as SLOW5"):
            call(path)


def _record_offsets(data: bytes) -> list[int]:
    (header_size,) = struct.unpack_from("<I", data, 64)
    pos, out = 68 + header_size, []
    while pos < len(data) - len(BLOW5_EOF):
        out.append(pos)
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]
    return out


def test_damaged_record_length(tmp_path, ecoli_blow5):
    """slow5lib trusts record lengths (a damaged one would crash it): caught before it reads."""
    data = bytearray(ecoli_blow5.read_bytes())
    third = _record_offsets(data)[2]
    data[third : third + 8] = struct.pack("<Q", 2**40)
    path = tmp_path / "bad_length.blow5"
    path.write_bytes(bytes(data))
    for call in _all_calls():
        with pytest.raises(InputError, match="record 3 overruns the file"):
            call(path)


def test_damaged_compressed_record(tmp_path, ecoli_blow5, fast5_records):
    data = bytearray(ecoli_blow5.read_bytes())
    at = _record_offsets(data)[1] + 200
    data[at : at + 16] = b"\xff" * 16
    path = tmp_path / "bad_record.blow5"
    path.write_bytes(bytes(data))
    got = []
    with pytest.raises(InputError, match="unreadable record after the last good read") as err:
        for rec in iter_slow5(path):
            got.append(rec.read_id)
    assert got == [fast5_records[0].read_id] and err.value.path == str(path)
    with pytest.raises(InputError, match="cannot index"):
        read_slow5(path, fast5_records[0].read_id)
