"""FAST5 reading: layouts, VBZ, f5c's pA arithmetic, and clean errors on bad files."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from streamer.errors import InputError
from streamer.io.fast5 import fast5_read_ids, iter_fast5, read_fast5
from streamer.io.signal_record import SignalRecord

ECOLI_FAST5 = sorted((Path(__file__).parent / "data" / "ecoli" / "fast5").glob("*.fast5"))
FORMATS = Path("/work/shared/data/formats/fast5_ont_fast5_api")
needs_formats = pytest.mark.skipif(not FORMATS.is_dir(), reason="shared FAST5 format samples absent")


def _open_files() -> int:
    return h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)


@pytest.fixture(autouse=True)
def no_leaked_file_handles():
    before = _open_files()
    yield
    assert _open_files() == before


def test_ecoli_single_read_files():
    assert ECOLI_FAST5
    for path in ECOLI_FAST5:
        (read_id,) = fast5_read_ids(path)
        (rec,) = iter_fast5(path)
        assert rec.read_id == read_id
        assert rec.raw.dtype == np.int16 and rec.raw.ndim == 1 and len(rec.raw) > 1000
        assert (rec.digitisation, rec.sample_rate) == (8192.0, 4000.0)
        same = read_fast5(path, read_id)
        assert np.array_equal(same.raw, rec.raw) and same.offset == rec.offset


def test_pa_uses_f5c_float32_arithmetic():
    rec = SignalRecord("r", np.arange(-3000, 3000, dtype=np.int16), 8191.0, 7.0, 1443.3, 4000.0)
    pa = rec.to_pa()
    assert pa.dtype == np.float32
    raw_unit = np.float32(1443.3) / np.float32(8191.0)
    expected = [(np.float32(v) + np.float32(7.0)) * raw_unit for v in rec.raw[::97]]
    assert pa[::97].tolist() == [float(v) for v in expected]
    # Other roundings (float64, or dividing per sample) differ; events depend on the exact bits.
    as_double = ((rec.raw + 7.0) * 1443.3 / 8191.0).astype(np.float32)
    divide_last = (rec.raw.astype(np.float32) + np.float32(7.0)) * np.float32(1443.3) / np.float32(8191.0)
    assert not np.array_equal(pa, as_double)
    assert not np.array_equal(pa, divide_last)


def test_missing_read_names_the_read():
    with pytest.raises(InputError, match="read not found") as err:
        read_fast5(ECOLI_FAST5[0], "no-such-read")
    assert err.value.read_id == "no-such-read"


def test_truncated_file(tmp_path):
    data = ECOLI_FAST5[0].read_bytes()
    path = tmp_path / "truncated.fast5"
    path.write_bytes(data[: len(data) // 2])
    for call in (fast5_read_ids, lambda p: list(iter_fast5(p)), lambda p: read_fast5(p, "x")):
        with pytest.raises(InputError, match="truncated") as err:
            call(path)
        assert err.value.path == str(path)
        assert isinstance(err.value.__cause__, OSError)


def test_random_bytes(tmp_path):
    path = tmp_path / "random.fast5"
    path.write_bytes(np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(InputError, match="not an HDF5 file"):
        fast5_read_ids(path)
    with pytest.raises(InputError, match="not an HDF5 file"):
        list(iter_fast5(path))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        fast5_read_ids(tmp_path / "absent.fast5")
    with pytest.raises(InputError, match="directory"):
        fast5_read_ids(tmp_path)


def test_corrupt_signal_chunk(tmp_path):
    path = tmp_path / "corrupt_chunk.fast5"
    shutil.copy(ECOLI_FAST5[0], path)
    path.chmod(0o644)
    (read_id,) = fast5_read_ids(path)
    with h5py.File(path, "r") as f:
        (name,) = f["Raw/Reads"]
        chunk = f[f"Raw/Reads/{name}/Signal"].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(chunk.byte_offset)
        fh.write(b"\xff" * min(chunk.size, 64))
    assert fast5_read_ids(path) == [read_id]  # listing needs no signal
    with pytest.raises(InputError, match="cannot read raw signal") as err:
        read_fast5(path, read_id)
    assert err.value.read_id == read_id
    assert isinstance(err.value.__cause__, OSError)


def test_calibration_missing(tmp_path):
    path = tmp_path / "no_calibration.fast5"
    shutil.copy(ECOLI_FAST5[0], path)
    path.chmod(0o644)
    with h5py.File(path, "r+") as f:
        del f["UniqueGlobalKey/channel_id"].attrs["range"]
    with pytest.raises(InputError, match="lacks range"):
        list(iter_fast5(path))


def test_abandoned_iterator_closes_file():
    it = iter_fast5(ECOLI_FAST5[0])
    next(it)
    it.close()


def _by_id(path: Path) -> dict[str, SignalRecord]:
    return {r.read_id: r for r in iter_fast5(path)}


@needs_formats
def test_multi_read_matches_single_reads():
    multi = _by_id(FORMATS / "multi_read" / "batch_0.fast5")
    assert len(multi) == 4
    singles = {}
    for path in sorted((FORMATS / "single_reads").glob("*.fast5")):
        singles.update(_by_id(path))
    assert singles.keys() == multi.keys()
    for read_id, rec in multi.items():
        one = singles[read_id]
        assert np.array_equal(one.raw, rec.raw)
        for field in ("digitisation", "offset", "range", "sample_rate"):
            assert getattr(one, field) == getattr(rec, field)
        by_id = read_fast5(FORMATS / "multi_read" / "batch_0.fast5", read_id)
        assert np.array_equal(by_id.to_pa(), rec.to_pa())


@needs_formats
def test_vbz_matches_gzip():
    vbz = _by_id(FORMATS / "vbz_reads" / "vbz_reads.fast5")
    gz = _by_id(FORMATS / "multi_read" / "batch_0.fast5")
    assert vbz.keys() == gz.keys()
    for read_id in gz:
        assert np.array_equal(vbz[read_id].raw, gz[read_id].raw)


@needs_formats
def test_vbz_single_reads_match_multi():
    multi = _by_id(FORMATS / "hardlink" / "unlinked" / "batch0.fast5")
    paths = sorted((FORMATS / "hardlink" / "single_reads").glob("*.fast5"))
    assert len(paths) == len(multi) == 8
    for path in paths:
        (rec,) = iter_fast5(path)
        assert rec.read_id == path.stem
        assert np.array_equal(rec.raw, multi[rec.read_id].raw)


@needs_formats
def test_legacy_v06_raw_file():
    (rec,) = iter_fast5(FORMATS / "read_file_v0.6_raw.fast5")
    assert rec.read_id == "e0c81aa8-a4fc-4f5f-a042-96af5bbf9d24"
    assert len(rec.raw) == 46037 and rec.sample_rate == 5000.0 and rec.offset == 24.0


@needs_formats
@pytest.mark.parametrize("name", ["read_file_v0.6_single.fast5", "read_file_v1.0_single.fast5"])
def test_file_without_raw_signal(name):
    with pytest.raises(InputError, match="without raw signal"):
        fast5_read_ids(FORMATS / name)


@needs_formats
def test_multi_read_group_without_signal():
    path = FORMATS / "rle_basecall_table" / "rle_example.fast5"
    (read_id,) = fast5_read_ids(path)
    with pytest.raises(InputError, match="no raw signal") as err:
        read_fast5(path, read_id)
    assert err.value.read_id == read_id
