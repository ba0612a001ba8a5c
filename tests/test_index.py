import shutil

import pytest

from streamer.errors import InputError
from streamer.io.index import SignalIndex, index_path_for, open_index

from conftest import READ1


@pytest.fixture
def run(ecoli, tmp_path):
    shutil.copytree(ecoli / "fast5", tmp_path / "fast5")
    shutil.copy(ecoli / "reads.fasta", tmp_path / "reads.fasta")
    return tmp_path


def test_index_built_cached_and_reused(run):
    idx = open_index(run / "reads.fasta", [run / "fast5"])
    assert len(idx) == 8 and idx.lookup(READ1).parent == (run / "fast5").resolve()
    assert index_path_for(run / "reads.fasta").is_file()
    again = open_index(run / "reads.fasta")  # no --signal: the cache answers
    assert again.paths == idx.paths


def test_index_rebuilt_when_signal_files_change(run):
    open_index(run / "reads.fasta", [run / "fast5"])
    victim = sorted((run / "fast5").glob("*.fast5"))[0]
    victim.unlink()
    idx = open_index(run / "reads.fasta", [run / "fast5"])
    assert len(idx) == 7


def test_corrupt_signal_file_is_recorded_not_fatal(run):
    (run / "fast5" / "broken.fast5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    idx = SignalIndex.build(sorted((run / "fast5").glob("*.fast5")))
    assert len(idx) == 8
    assert list(idx.bad_files) == [str(run / "fast5" / "broken.fast5")]


def test_no_index_and_no_signal_is_a_clear_error(run):
    with pytest.raises(InputError, match="no signal index"):
        open_index(run / "reads.fasta")


def test_a_read_only_folder_keeps_its_index_in_the_user_cache(run, tmp_path, monkeypatch, caplog):
    """As root every folder is writable, so the folder's write permission is what is stubbed."""
    import os

    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(run) else real_access(p, mode))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with caplog.at_level("INFO"):
        idx = open_index(run / "reads.fasta", [run / "fast5"])
    assert not list(run.glob("*.streamer-index.tsv"))  # nothing written beside the reads
    cached = index_path_for(run / "reads.fasta")
    assert cached.is_file() and cached.is_relative_to(tmp_path / "cache" / "streamer")
    assert [r.getMessage() for r in caplog.records if "read-only" in r.getMessage()] == [
        f"{run / 'reads.fasta'}: its folder is read-only: the read index is kept in {cached.parent}"]
    assert open_index(run / "reads.fasta").paths == idx.paths  # found there next time, no --signal needed


@pytest.mark.parametrize("what", ["absent", "folder"])
def test_a_reads_path_that_is_not_a_file_is_named_and_nothing_is_written(run, what):
    reads = run / "nope.fasta" if what == "absent" else run / "fast5"
    with pytest.raises(InputError, match="no such file" if what == "absent" else "a folder, not a reads file"):
        open_index(reads, [run / "fast5"])
    assert not list(run.rglob("*.streamer-index.tsv"))
