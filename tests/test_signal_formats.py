"""One interface over FAST5, POD5 and SLOW5/BLOW5: content detection, completeness, the signal
index over mixed folders, real files from other writers, and `streamer call` giving the
same output from every format."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ECOLI, REFERENCE
from streamer.errors import InputError
from streamer.pipeline.events import detect_events
from streamer.io.index import SignalIndex
from streamer.io.pod5 import write_pod5
from streamer.io.signal import (
    find_signal_files,
    is_complete,
    iter_signal,
    read_signal,
    read_signals,
    signal_format,
    signal_read_ids,
)
from streamer.io.slow5 import write_blow5

FAST5_FILES = sorted((ECOLI / "fast5").glob("*.fast5"))
FORMATS = Path("/work/shared/data/formats")
REAL_FILES = [FORMATS / "pod5_dorado" / "chr1_MAT.pod5",
              FORMATS / "blow5_slow5tools" / "na12878_prom_merged_r9.4.1_chr22_read1.blow5"]  # fmt: skip
needs_real = pytest.mark.skipif(not all(p.is_file() for p in REAL_FILES), reason="shared format samples absent")


@pytest.fixture(autouse=True)
def index_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("STREAMER_SLOW5_INDEX_DIR", str(tmp_path / "slow5-index"))
    return tmp_path / "slow5-index"


@pytest.fixture(scope="module")
def fast5_records():
    return {rec.read_id: rec for path in FAST5_FILES for rec in iter_signal(path)}


@pytest.fixture(scope="module")
def copies(tmp_path_factory, fast5_records) -> dict[str, Path]:
    """The fixture reads as one POD5 and one BLOW5 file, each in its own folder."""
    root = tmp_path_factory.mktemp("formats")
    (root / "pod5").mkdir()
    (root / "blow5").mkdir()
    write_pod5(root / "pod5" / "reads.pod5", fast5_records.values())
    write_blow5(root / "blow5" / "reads.blow5", fast5_records.values())
    return {"pod5": root / "pod5" / "reads.pod5", "blow5": root / "blow5" / "reads.blow5"}


@pytest.mark.parametrize("fmt", ["pod5", "blow5"])
def test_same_reads_as_fast5(fmt, copies, fast5_records):
    path = copies[fmt]
    assert signal_format(path) == fmt
    assert signal_read_ids(path) == list(fast5_records)
    for rec in iter_signal(path):
        want = fast5_records[rec.read_id]
        assert rec.sample_rate == want.sample_rate and rec.to_pa().tobytes() == want.to_pa().tobytes()
    for read_id, want in fast5_records.items():
        assert read_signal(path, read_id).to_pa().tobytes() == want.to_pa().tobytes()
    some = list(fast5_records)[2:5] + ["absent"]
    assert sorted(r.read_id for r in read_signals(path, some)) == sorted(some[:3])


def test_fast5_through_the_same_interface(fast5_records):
    path = FAST5_FILES[0]
    assert signal_format(path) == "fast5"
    (read_id,) = signal_read_ids(path)
    assert [r.read_id for r in read_signals(path, [read_id, "absent"])] == [read_id]
    assert np.array_equal(read_signal(path, read_id).raw, fast5_records[read_id].raw)


def test_content_decides_not_the_extension(tmp_path, copies, fast5_records):
    disguised = {
        tmp_path / "really_pod5.fast5": copies["pod5"],
        tmp_path / "really_blow5.pod5": copies["blow5"],
        tmp_path / "really_fast5.blow5": FAST5_FILES[0],
        tmp_path / "no_extension": copies["pod5"],
    }
    for dst, src in disguised.items():
        shutil.copyfile(src, dst)
        assert signal_format(dst) == signal_format(src)
        assert signal_read_ids(dst) == signal_read_ids(src)
        assert is_complete(dst)
    read_id = signal_read_ids(FAST5_FILES[0])[0]
    assert read_signal(tmp_path / "really_fast5.blow5", read_id).to_pa().tobytes() == fast5_records[read_id].to_pa().tobytes()


def test_unrecognised_content(tmp_path):
    junk = np.random.default_rng(3).integers(0, 256, 2048, dtype=np.uint8).tobytes()
    (tmp_path / "junk.dat").write_bytes(junk)
    with pytest.raises(InputError, match="not a signal file"):
        signal_read_ids(tmp_path / "junk.dat")
    (tmp_path / "junk.pod5").write_bytes(junk)  # the extension picks the reader that explains
    with pytest.raises(InputError, match="not a POD5 file"):
        signal_read_ids(tmp_path / "junk.pod5")
    with pytest.raises(InputError, match="no such file"):
        signal_format(tmp_path / "absent.pod5")


def test_find_signal_files(tmp_path, copies):
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    for name, src in {"a.pod5": copies["pod5"], "sub/b.blow5": copies["blow5"], "c.fast5": FAST5_FILES[0]}.items():
        shutil.copyfile(src, run / name)
    for name in ("d.slow5", "notes.txt", "sub/b.blow5.idx", "e.pod5.tmp"):
        (run / name).write_text("#slow5_version\t0.2.0\n")
    found = find_signal_files([run])
    assert [p.relative_to(run).as_posix() for p in found] == ["a.pod5", "c.fast5", "d.slow5", "sub/b.blow5"]
    assert find_signal_files([run / "e.pod5.tmp"]) == [run / "e.pod5.tmp"]  # named files are taken as they are


def test_is_complete(tmp_path, copies):
    for src in (copies["pod5"], copies["blow5"], FAST5_FILES[0]):
        assert is_complete(src)
        data = src.read_bytes()
        cut = tmp_path / f"cut{src.suffix}"
        cut.write_bytes(data[: len(data) - 100])
        assert not is_complete(cut), src.suffix
    (tmp_path / "empty.pod5").write_bytes(b"")
    assert not is_complete(tmp_path / "empty.pod5")
    assert not is_complete(tmp_path / "absent.blow5")


def test_index_over_a_mixed_folder_sets_bad_files_aside(tmp_path, copies, fast5_records):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(copies["pod5"], run / "reads.pod5")
    data = copies["blow5"].read_bytes()
    (run / "cut.blow5").write_bytes(data[: len(data) // 2])
    shutil.copyfile(FAST5_FILES[0], run / "one.fast5")
    index = SignalIndex.build(find_signal_files([run]))
    assert list(index.bad_files) == [str(run / "cut.blow5")]
    assert "truncated BLOW5" in index.bad_files[str(run / "cut.blow5")]
    assert len(index) == len(fast5_records)
    for read_id, want in fast5_records.items():
        assert read_signal(index.lookup(read_id), read_id).to_pa().tobytes() == want.to_pa().tobytes()


@needs_real
@pytest.mark.parametrize("path", REAL_FILES, ids=["pod5_dorado", "blow5_slow5tools"])
def test_real_files_from_other_writers_process(path):
    (rec,) = iter_signal(path)
    assert signal_read_ids(path) == [rec.read_id]
    assert rec.sample_rate == {".pod5": 5000.0, ".blow5": 4000.0}[path.suffix]
    pa = rec.to_pa()
    assert 40 < float(np.median(pa)) < 150  # picoamperes, not ADC units
    ev_off, start, length, mean, stdv = detect_events(pa, np.array([0, len(pa)], np.int64))
    assert ev_off[1] > len(pa) // 20 and np.all(np.isfinite(mean))


@pytest.mark.parametrize("command, flags", [("call", []), ("eventalign", ["--print-read-names", "--signal-index"])])
def test_output_identical_for_every_format(tmp_path, copies, command, flags):
    outputs = {}
    for fmt, signal in (("fast5", ECOLI / "fast5"), ("pod5", copies["pod5"].parent), ("blow5", copies["blow5"].parent)):
        work = tmp_path / fmt
        work.mkdir()
        shutil.copy(ECOLI / "reads.fasta", work / "reads.fasta")
        proc = subprocess.run(
            [sys.executable, "-m", "streamer", command, "-r", work / "reads.fasta", "-b", ECOLI / "reads.bam",
             "-g", REFERENCE, "--signal", signal, "-o", work / "out.tsv", "-t", "2", *flags],
            capture_output=True, text=True,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        outputs[fmt] = (work / "out.tsv").read_bytes()
    assert outputs["fast5"].count(b"\n") > 100
    assert outputs["pod5"] == outputs["fast5"] and outputs["blow5"] == outputs["fast5"]
