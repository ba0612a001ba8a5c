"""`streamer eventalign` against nanopolish 0.14 and f5c 1.1: rows, number formats, --summary."""

from __future__ import annotations

import csv
import gzip
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import ECOLI, READ1, REFERENCE, SHARED, needs_shared
from streamer.publish.protocol import decode_columns, encode_columns

EXPECTED = SHARED / "expected"


def eventalign(tmp_path: Path, reads: Path, bam: Path, signal: Path, *flags: str) -> tuple[list[list[str]], Path]:
    """Run the command; return the TSV rows (header first) and the --summary file."""
    shutil.copy(reads, tmp_path / "reads.fasta")
    out, summary = tmp_path / "eventalign.tsv", tmp_path / "summary.tsv"
    proc = subprocess.run(
        [sys.executable, "-m", "streamer", "eventalign", "-r", tmp_path / "reads.fasta", "-b", bam, "-g", REFERENCE,
         "--signal", signal, "-t", "2", "-o", out, "--summary", summary, *flags],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return read_tsv(out), summary


def heads(rows: list[list[str]], n: int) -> list[list[str]]:
    """The header and the first n rows of each run of rows of one read record (as the fixtures keep them)."""
    out, prev, count = [rows[0]], None, 0
    for r in rows[1:]:
        count = count + 1 if r[3] == prev else 1
        prev = r[3]
        if count <= n:
            out.append(r)
    return out


def read_sam(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return fh.read().splitlines()


def read_tsv(path: Path) -> list[list[str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return [line.rstrip("\n").split("\t") for line in fh]


def compare(ours: list[list[str]], theirs: list[list[str]]) -> tuple[int, int]:
    """(rows identical, rows that differ): the same events in the same order either way.

    A differing row may have values one unit of their last printed digit apart, or put its
    event on a neighbouring k-mer of the same homopolymer run (the same model k-mer).
    """
    assert ours[0] == theirs[0]
    assert len(ours) == len(theirs)
    same = near = 0
    numeric = (6, 7, 8, 10, 11, 12)
    for a, b in zip(ours[1:], theirs[1:]):
        if a == b:
            same += 1
            continue
        near += 1
        assert [a[i] for i in (0, 2, 3, 4, 5, 9)] == [b[i] for i in (0, 2, 3, 4, 5, 9)], (a, b)
        assert a[13:] == b[13:], (a, b)  # signal span
        if a[1] != b[1]:
            assert abs(int(a[1]) - int(b[1])) == 1 and len(set(a[2])) == 1, (a, b)
        for i in numeric:
            unit = 10.0 ** -len(a[i].split(".")[1])
            assert a[i] == b[i] or abs(float(a[i]) - float(b[i])) <= unit * 1.001, (a, b)
    return same, near


def summary_rows(path: Path) -> Counter:
    """Summary rows without the read index and the signal file's folder (both depend on the run)."""
    with open(path) as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return Counter(
        tuple(v if k != "fast5_path" else Path(v).name for k, v in r.items() if k != "read_index") for r in rows
    )


@pytest.fixture(scope="module")
def fixture_scaled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scaled")
    return eventalign(tmp, ECOLI / "reads.fasta", ECOLI / "reads.bam", ECOLI / "fast5",
                      "--print-read-names", "--scale-events", "--signal-index", "--samples")  # fmt: skip


@pytest.fixture(scope="module")
def fixture_nanopolish(tmp_path_factory):
    """nanopolish's arithmetic, and its defaults: no MAPQ filter, secondary alignments too."""
    tmp = tmp_path_factory.mktemp("nanopolish")
    return eventalign(tmp, ECOLI / "reads.fasta", ECOLI / "reads.bam", ECOLI / "fast5", "--compat", "nanopolish",
                      "--min-mapq", "0", "--secondary", "yes", "--print-read-names", "--signal-index", "--samples")  # fmt: skip


@pytest.fixture(scope="module")
def fixture_nanopolish_scaled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nanopolish_scaled")
    return eventalign(tmp, ECOLI / "reads.fasta", ECOLI / "reads.bam", ECOLI / "fast5", "--compat", "nanopolish",
                      "--min-mapq", "0", "--secondary", "yes", "--print-read-names", "--scale-events", "--signal-index")  # fmt: skip


def test_fixture_read1_matches_nanopolish(tmp_path, fixture_scaled):
    rows, summary = fixture_scaled
    expected = read_tsv(ECOLI / "read1.eventalign.scaled.nanopolish-0.14.head.tsv.gz")
    ours = [rows[0][:15]] + [r[:15] for r in rows if r[3] == READ1][: len(expected) - 1]
    assert compare(ours, expected) == (len(expected) - 1, 0)
    # the reads' summaries are f5c's, and nanopolish's read1 row is the same
    assert summary_rows(summary) == summary_rows(ECOLI / "eventalign.summary.f5c-1.1.tsv")


def test_fixture_unscaled_read1(tmp_path):
    rows, _ = eventalign(tmp_path, ECOLI / "reads.fasta", ECOLI / "reads.bam", ECOLI / "fast5", "--print-read-names")
    expected = read_tsv(ECOLI / "read1.eventalign.nanopolish-0.14.head.tsv.gz")
    ours = [rows[0]] + [r for r in rows if r[3] == READ1][: len(expected) - 1]
    same, near = compare(ours, expected)
    # three events of a TTTTTTTTT run tie between two paths; f5c's float32 arithmetic (followed
    # by default) puts them one k-mer earlier than nanopolish's double-precision scaling does
    assert (same, near) == (len(expected) - 1 - 3, 3)


def test_fixture_compat_nanopolish_read1(fixture_nanopolish, fixture_nanopolish_scaled):
    for (rows, _), name in ((fixture_nanopolish, "read1.eventalign.nanopolish-0.14.head.tsv.gz"),
                            (fixture_nanopolish_scaled, "read1.eventalign.scaled.nanopolish-0.14.head.tsv.gz")):  # fmt: skip
        expected = read_tsv(ECOLI / name)
        width = len(expected[0])
        ours = [rows[0][:width]] + [r[:width] for r in rows if r[3] == READ1][: len(expected) - 1]
        assert ours == expected  # 3000 and 2000 rows, every byte, the TTTTTTTTT run included


def test_fixture_samples_match_f5c(fixture_scaled):
    """--samples with --scale-events --signal-index: f5c 1.1's rows, the first 200 of each record."""
    rows, _ = fixture_scaled
    expected = read_tsv(ECOLI / "eventalign.samples.scaled.f5c-1.1.head.tsv.gz")
    assert heads(rows, 200) == expected  # 1800 rows


def test_fixture_samples_match_nanopolish(fixture_nanopolish):
    """--samples --signal-index (model scaled to the events): nanopolish 0.14's rows under --compat nanopolish."""
    rows, _ = fixture_nanopolish
    expected = read_tsv(ECOLI / "eventalign.samples.nanopolish-0.14.head.tsv.gz")
    assert heads(rows, 200) == expected  # 1800 rows


def test_read_indices_samples_and_columns(tmp_path):
    rows, _ = eventalign(tmp_path, ECOLI / "reads.fasta", ECOLI / "reads.bam", ECOLI / "fast5", "--samples",
                         "--signal-index")  # fmt: skip
    header = rows[0]
    assert header[3] == "read_index" and header[-3:] == ["start_idx", "end_idx", "samples"]
    assert {r[3] for r in rows[1:]} == {str(i) for i in range(9)}  # BAM record numbers
    for r in rows[1:2000]:
        samples = r[-1].split(",")
        assert len(samples) == int(r[14]) - int(r[13])
        mean = float(r[6])  # unscaled events: the samples are scaled, so compare loosely
        assert np.isfinite(mean) and all(np.isfinite(float(s)) for s in samples)


def test_columns_publish_as_the_eventalign_topic():
    from streamer.pipeline.batching import Pending, batch_inputs
    from streamer.pipeline.batch import pack
    from streamer.io.alignments import AlignmentRecord, AlignmentFilter, iter_alignments
    from streamer.io.fastx import load_basecalls
    from streamer.io.reference import Reference
    from streamer.io.index import SignalIndex
    from streamer.io.signal import find_signal_files, read_signal
    from streamer.pipeline.stages import Pipeline
    from streamer_plugins.eventalign import EventalignOptions, EventalignStage, format_tsv

    alns = [a for a in iter_alignments(ECOLI / "reads.bam", AlignmentFilter()) if isinstance(a, AlignmentRecord)][:2]
    seqs = load_basecalls(ECOLI / "reads.fasta", {a.read_id for a in alns})
    index = SignalIndex.build(find_signal_files([ECOLI / "fast5"]))
    with Reference(REFERENCE) as ref:
        signals = {a.read_id: read_signal(index.lookup(a.read_id), a.read_id) for a in alns}
        reads, _ = batch_inputs([Pending(a, seqs[a.read_id], index.lookup(a.read_id)) for a in alns], signals, {}, ref)
    result = Pipeline(analyses=[EventalignStage()]).run_batch(pack(reads))
    rows, batch = result.products["eventalign"], result.batch
    assert len(rows) > 1000 and rows.row_off[-1] == len(rows)
    cols = rows.columns(batch.read_ids, batch.ref_names)
    back = decode_columns(encode_columns(cols, None), None)
    text = format_tsv(rows, batch, batch.read_ids, EventalignOptions(print_read_names=True))
    first = text.splitlines()[0].split("\t")
    assert back["read"][0] == first[3] and back["position"][0] == int(first[1])
    assert f"{back['event_level_mean'][0]:.2f}" == first[6]


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared")
    return eventalign(tmp, SHARED / "reads.fasta", SHARED / "reads.mg1655.sorted.bam", SHARED / "fast5_files",
                      "--print-read-names", "--signal-index")  # fmt: skip


@needs_shared
def test_first_three_reads_match_f5c(shared_run):
    rows, _ = shared_run
    expected = read_tsv(EXPECTED / "f5c-1.1" / "eventalign.first3reads.tsv.gz")
    names = {r[3] for r in expected[1:]}
    ours = [rows[0]] + [r for r in rows[1:] if r[3] in names]
    assert compare(ours, expected) == (len(expected) - 1, 0)  # 46658 rows, every byte


@needs_shared
def test_read1_matches_nanopolish(shared_run):
    rows, _ = shared_run
    expected = read_tsv(EXPECTED / "nanopolish-0.14" / "read1.eventalign.tsv.gz")
    ours = [r[:13] for r in rows if r[3] == READ1 or r is rows[0]]
    same, near = compare(ours, expected)
    assert (same, near) == (len(expected) - 1 - 3, 3)  # 6818 of 6821 identical; see the fixture test


@needs_shared
def test_read1_scaled_matches_nanopolish(fixture_scaled):
    rows, _ = fixture_scaled
    expected = read_tsv(EXPECTED / "nanopolish-0.14" / "read1.eventalign.scaled.tsv.gz")
    ours = [rows[0][:15]] + [r[:15] for r in rows[1:] if r[3] == READ1]
    assert compare(ours, expected) == (len(expected) - 1 - 3, 3)


@needs_shared
def test_read1_compat_nanopolish_matches_nanopolish(fixture_nanopolish, fixture_nanopolish_scaled):
    for (rows, _), name in ((fixture_nanopolish, "read1.eventalign.tsv.gz"),
                            (fixture_nanopolish_scaled, "read1.eventalign.scaled.tsv.gz")):  # fmt: skip
        expected = read_tsv(EXPECTED / "nanopolish-0.14" / name)
        width = len(expected[0])
        ours = [rows[0][:width]] + [r[:width] for r in rows[1:] if r[3] == READ1]
        assert ours == expected  # 6821 rows each, every byte


@needs_shared
def test_summary_matches_f5c_and_nanopolish(shared_run):
    _, summary = shared_run
    ours = summary_rows(summary)
    assert ours == summary_rows(EXPECTED / "f5c-1.1" / "eventalign.summary.tsv")  # 117 reads
    # nanopolish leaves model_name empty and has no MAPQ filter (two MAPQ 0 records more)
    theirs = Counter({(r[0], r[1], "dna", *r[3:]): n for r, n in summary_rows(EXPECTED / "nanopolish-0.14" /
                                                                               "eventalign.summary.tsv").items()})
    assert not ours - theirs and sum((theirs - ours).values()) == 2


def test_event_cigar():
    from streamer_plugins.eventalign import event_cigar

    # events 5..10 on bases 100, 100, 101, 104, 105, 105: clip, M, I, M, D2 M, M, I
    pos = np.array([100, 100, 101, 104, 105, 105])
    ev = np.arange(5, 11)
    assert event_cigar(pos, ev) == [(4, 5), (0, 1), (1, 1), (0, 1), (2, 2), (0, 2), (1, 1)]


def eventalign_sam(tmp_path: Path, *flags: str) -> Path:
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    sam = tmp_path / "events.sam"
    proc = subprocess.run([sys.executable, "-m", "streamer", "eventalign", "-r", tmp_path / "reads.fasta", "-b",
                           ECOLI / "reads.bam", "-g", REFERENCE, "--signal", ECOLI / "fast5", "-t", "2", "--sam",
                           "-o", sam, *flags], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return sam


@pytest.fixture(scope="module")
def fixture_sam(tmp_path_factory):
    return eventalign_sam(tmp_path_factory.mktemp("sam"))


def test_sam_matches_f5c(fixture_sam):
    """Header and records (flags, positions, MAPQ, CIGAR, ES tag) as f5c 1.1 writes them."""
    assert read_sam(fixture_sam) == read_sam(ECOLI / "eventalign.f5c-1.1.sam.gz")  # 9 records


def test_sam_compat_nanopolish_matches_nanopolish(tmp_path):
    sam = eventalign_sam(tmp_path, "--compat", "nanopolish", "--min-mapq", "0", "--secondary", "yes")
    expected = read_sam(ECOLI / "eventalign.nanopolish-0.14.sam.gz")
    assert read_sam(sam) == expected
    # the TTTTTTTTT run of read1 is where the tools' records differ
    assert expected != read_sam(ECOLI / "eventalign.f5c-1.1.sam.gz")


def test_sam_records_span_the_rows(fixture_sam, fixture_scaled):
    import pysam

    rows, _ = fixture_scaled
    sam = fixture_sam
    by_read: dict[str, list[list[str]]] = {}
    for r in rows[1:]:
        by_read.setdefault(r[3], []).append(r)
    records = list(pysam.AlignmentFile(str(sam)))
    assert len(records) == 9
    read1 = next(rec for rec in records if rec.query_name == f"{READ1}.template")
    mine = by_read[READ1]
    assert read1.reference_start == int(mine[0][1]) and read1.reference_end == int(mine[-1][1]) + 1
    assert read1.cigartuples[0] == (4, int(mine[0][5]))  # events before the first aligned one
    assert read1.infer_query_length() - read1.cigartuples[0][1] == len(mine)  # M + I: one per row
    assert read1.get_tag("ES") == 1 and read1.mapping_quality == 60


def test_row_writer_prints_as_printf():
    from streamer_plugins.printf import FLOAT32_BITS, put_fixed

    rng = np.random.default_rng(3)
    values = np.concatenate([
        rng.normal(0, 50, 20000), rng.uniform(0, 0.01, 5000), np.arange(-2000, 2000) / 8,  # exact ties
        [0.0, -0.0, 0.005, 0.125, 0.375, 1e-7, -1e-7, 1e5, np.inf, -np.inf, np.nan],
    ]).astype(np.float32)  # fmt: skip
    buf = np.empty(64, np.uint8)
    for decimals in (2, 3, 5):
        for x in values.tolist():
            n = put_fixed(buf, 0, x, decimals, FLOAT32_BITS, True)
            assert buf[:n].tobytes().decode() == f"{x:.{decimals}f}", x


def test_fixture_as_blow5_sam_version_2_and_summary_are_f5c_16s(tmp_path, monkeypatch):
    """The fixture's reads as BLOW5, which f5c 1.6 reads: `--sam --sam-out-version 2` (its default: each input
    record with si/ss/sc/sh tags; both strands and a supplementary record) and `--summary` (the signal named
    `slow5`) are what f5c 1.6 writes."""
    from streamer.io.signal import iter_signal
    from streamer.io.slow5 import write_blow5

    monkeypatch.setenv("STREAMER_SLOW5_INDEX_DIR", str(tmp_path / "slow5-index"))
    blow5 = tmp_path / "reads.blow5"
    write_blow5(blow5, [rec for path in sorted((ECOLI / "fast5").glob("*.fast5")) for rec in iter_signal(path)])
    _, summary = eventalign(tmp_path, ECOLI / "reads.fasta", ECOLI / "reads.bam", blow5)
    assert summary.read_text() == (ECOLI / "eventalign.summary.blow5.f5c-1.6.tsv").read_text()
    sam = tmp_path / "ea.sam"
    proc = subprocess.run([sys.executable, "-m", "streamer", "eventalign", "-r", tmp_path / "reads.fasta", "-b",
                           ECOLI / "reads.bam", "-g", REFERENCE, "--signal", blow5, "-t", "2", "--sam",
                           "--sam-out-version", "2", "-o", sam], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with gzip.open(ECOLI / "eventalign.sam2.f5c-1.6.sam.gz", "rt") as fh:
        want = fh.read()
    assert want.count("\tsi:Z:") == 9 and sam.read_text() == want
