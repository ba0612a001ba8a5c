"""`streamer call` end to end, as a user runs it: parity with nanopolish/f5c, and bad input."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pysam

from conftest import ECOLI, REFERENCE, SHARED, needs_shared


def streamer(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamer", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env=env)


def load_calls(path) -> dict[tuple, float]:
    with open(path) as fh:
        return {
            (r["read_name"], r["chromosome"], r["strand"], int(r["start"]), int(r["end"])): float(r["log_lik_ratio"])
            for r in csv.DictReader(fh, delimiter="\t")
        }


def agreement(ours: dict, theirs: dict) -> tuple[float, float]:
    diffs = np.array([abs(ours[k] - theirs[k]) for k in theirs])
    # values are printed with two decimals: 0.01 apart means one unit in the last place
    return float(np.mean(diffs <= 0.01 + 1e-9)), float(np.mean(diffs <= 0.5))


def call(tmp_path, reads, bam, signal, ref=REFERENCE, *extra):
    shutil.copy(reads, tmp_path / "reads.fasta")
    out = tmp_path / "meth.tsv"
    proc = streamer("call", "-r", tmp_path / "reads.fasta", "-b", bam, "-g", ref, "--signal", signal,
                    "-o", out, "-t", "2", *extra)  # fmt: skip
    return proc, out


def test_fixture_matches_nanopolish_and_f5c(tmp_path):
    proc, out = call(tmp_path, ECOLI / "reads.fasta", ECOLI / "reads.bam", ECOLI / "fast5")
    assert proc.returncode == 0, proc.stderr
    ours = load_calls(out)
    for tool in ("nanopolish-0.14", "f5c-1.1"):
        theirs = load_calls(ECOLI / f"meth.{tool}.tsv")
        assert set(ours) == set(theirs)
        assert agreement(ours, theirs) == (1.0, 1.0)
    assert "records called:   9" in proc.stderr and "calls written:    790" in proc.stderr
    assert "Traceback" not in proc.stderr


@needs_shared
def test_all_shared_reads_match_nanopolish_and_f5c(tmp_path):
    proc, out = call(tmp_path, SHARED / "reads.fasta", SHARED / "reads.mg1655.sorted.bam", SHARED / "fast5_files")
    assert proc.returncode == 0, proc.stderr
    ours = load_calls(out)
    for tool in ("nanopolish-0.14", "f5c-1.1"):
        theirs = load_calls(SHARED / "expected" / tool / "meth.tsv")
        assert set(ours) == set(theirs)
        within_001, within_05 = agreement(ours, theirs)
        assert within_001 >= 0.99 and within_05 >= 0.999
    # f5c's arithmetic throughout (float32 scalings, log var from recalibration's double var)
    assert ours == load_calls(SHARED / "expected" / "f5c-1.1" / "meth.tsv")
    freq = tmp_path / "freq.tsv"
    assert streamer("meth-freq", out, "-o", freq).returncode == 0
    assert freq.read_text() == (SHARED / "expected" / "f5c-1.1" / "freq.tsv").read_text()
    split = streamer("meth-freq", "-s", out)
    assert split.stdout == (SHARED / "expected" / "f5c-1.1" / "freq-split.tsv").read_text()


def _bad_run(tmp_path):
    """The fixture plus one read for each kind of bad input; returns (reads, bam, signal dir)."""
    sig = tmp_path / "fast5"
    shutil.copytree(ECOLI / "fast5", sig)
    for f in sig.iterdir():
        f.chmod(0o644)
    files = sorted(sig.iterdir())
    # a truncated copy of a real file, and random bytes, under new names
    trunc = sig / "truncated.fast5"
    trunc.write_bytes(files[0].read_bytes()[: files[0].stat().st_size // 2])
    (sig / "corrupt.fast5").write_bytes(np.random.default_rng(1).bytes(5000))
    # a read whose signal is empty: it yields no events
    flat = sig / "flat.fast5"
    shutil.copy(files[1], flat)
    with h5py.File(flat, "r+") as h:
        grp = next(iter(h["Raw/Reads"].values()))
        flat_id = grp.attrs["read_id"].decode()
        grp.attrs["read_id"] = b"flat-signal-read"
        del grp["Signal"]
        grp["Signal"] = np.zeros(0, dtype=np.int16)
    with open(ECOLI / "reads.fasta") as fh:
        seqs = dict(zip(*[iter(l.strip() for l in fh)] * 2))
    reads = tmp_path / "reads.fasta"
    with open(reads, "w") as fh:
        for name, s in seqs.items():
            fh.write(f"{name}\n{s}\n")
        fh.write(f">no-signal-read\n{seqs['>' + flat_id]}\n>flat-signal-read\n{seqs['>' + flat_id]}\n")
    bam = tmp_path / "reads.bam"
    with pysam.AlignmentFile(ECOLI / "reads.bam") as src, pysam.AlignmentFile(bam, "wb", template=src) as dst:
        for rec in src:
            dst.write(rec)
            if rec.query_name == flat_id and not rec.is_supplementary:
                for name, mapq, flag in [
                    ("no-basecall-read", 60, rec.flag),
                    ("no-signal-read", 60, rec.flag),
                    ("flat-signal-read", 60, rec.flag),
                    ("low-mapq-read", 3, rec.flag),
                ]:
                    extra = pysam.AlignedSegment.fromstring(rec.to_string(), src.header)
                    extra.query_name, extra.mapping_quality, extra.flag = name, mapq, flag
                    dst.write(extra)
    return reads, bam, sig


def test_bad_input_is_reported_and_the_run_goes_on(tmp_path):
    reads, bam, sig = _bad_run(tmp_path)
    out = tmp_path / "meth.tsv"
    proc = streamer("call", "-r", reads, "-b", bam, "-g", REFERENCE, "--signal", sig, "-o", out, "-t", "2")
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "Traceback" not in err
    assert f"{sig / 'truncated.fast5'}: unreadable signal file" in err
    assert f"{sig / 'corrupt.fast5'}: unreadable signal file" in err
    assert f"read no-basecall-read: skipped (no basecall): not in {reads}" in err
    assert "read no-signal-read: skipped (no signal): not found in the signal files" in err
    # reads the analysis passes over are counted, their lines kept for -v: a run has millions of reads
    assert "low-mapq-read" not in err and "flat-signal-read" not in err
    assert "low mapq: 1" in err and "no events: 1" in err
    # every good read still produced exactly its calls
    expected = load_calls(ECOLI / "meth.nanopolish-0.14.tsv")
    assert set(load_calls(out)) == set(expected)
    assert "alignment records considered: 13 " in err
    assert "records skipped:  4" in err


def test_malformed_model_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.model"
    bad.write_text("#k\t6\nAAAAAA\t80.0\t1.0\n")
    proc, _ = call(tmp_path, ECOLI / "reads.fasta", ECOLI / "reads.bam", ECOLI / "fast5", REFERENCE,
                   "--kmer-model", bad)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"streamer call: {bad}: 1 rows, expected 4^6 = 4096 for alphabet ACGT"
    ]


def test_the_trace_shows_when_the_readers_came_up_and_where_the_bam_was_parsed(tmp_path):
    """With reader processes, what gates the first batch's reads is on the timeline too: the time until the
    first reader was up, and each chunk of -b's records parsed in the parsing process."""
    proc, out = call(tmp_path, ECOLI / "reads.fasta", ECOLI / "reads.bam", ECOLI / "fast5", REFERENCE,
                     "--io-mode", "processes", "--trace", tmp_path / "trace.json")
    assert proc.returncode == 0, proc.stderr
    spans = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    (up,) = [e for e in spans if e["name"] == "readers up"]
    assert up["args"]["workers"] >= 1 and up["dur"] > 0 and up["tid"].endswith(" reader-start")
    parsed = [e for e in spans if e["name"] == "parse"]
    assert parsed and sum(e["args"]["records"] for e in parsed) == 9  # the fixture BAM's records, in one chunk
    assert all(e["tid"].endswith(" parsing") and e["tid"].split()[0] != up["tid"].split()[0] for e in parsed)
    first_read = min(e["ts"] for e in spans if e["name"] == "read")
    assert min(e["ts"] for e in parsed) < first_read  # a batch is planned from its records before it is read
    hmm = [e for e in spans if e["name"] == "hmm"]  # the caller's stage: its jobs planned, then scored, inside it
    assert hmm and all(0 <= e["args"]["cpu_ms"] <= e["dur"] / 1e3 + 1 for e in hmm)
    for part in ("plan jobs", "score jobs"):
        inner = [e for e in spans if e["name"] == part]
        assert len(inner) == len(hmm)
        assert all(any(h["ts"] <= e["ts"] and e["ts"] + e["dur"] <= h["ts"] + h["dur"] + 1 for h in hmm) for e in inner)


def test_a_run_with_reader_processes_leaves_nothing_in_the_temp_folder(tmp_path):
    """The readers' fork server keeps its socket in a folder of the system's temp folder, which the process's
    quick exit would otherwise leave behind, one a run."""
    temp = tmp_path / "temp"
    temp.mkdir()
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    proc = streamer("call", "-r", tmp_path / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE, "--signal",
                    ECOLI / "fast5", "-o", tmp_path / "meth.tsv", "-t", "2", "--io-mode", "processes",
                    env={**os.environ, "TMPDIR": str(temp)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "meth.tsv").read_text().count("\n") > 1
    assert not [p.name for p in temp.iterdir() if p.name.startswith("pymp-")]


def test_memory_budget_sizes_batches_not_output(tmp_path):
    """A small budget gives small batches and reader threads; the calls are byte for byte the same."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    proc, out = call(tmp_path / "a", ECOLI / "reads.fasta", ECOLI / "reads.bam", ECOLI / "fast5")
    assert proc.returncode == 0, proc.stderr
    stats = tmp_path / "stats.json"
    small, small_out = call(tmp_path / "b", ECOLI / "reads.fasta", ECOLI / "reads.bam", ECOLI / "fast5", REFERENCE,
                            "--memory-budget", "100M", "--stats-json", stats, "--trace", tmp_path / "trace.json")
    assert small.returncode == 0, small.stderr
    assert small_out.read_bytes() == out.read_bytes()
    summary = json.loads(stats.read_text())
    assert summary["memory_budget_mb"] == 100 and summary["peak_memory_mb"] > 0
    # the timeline: every batch assembled, computed stage by stage and written; its reads on the readers
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    names = {e["name"] for e in spans}
    assert {"read", "assemble", "batch", "events", "abea", "hmm", "write"} <= names
    batches = [e for e in spans if e["name"] == "batch"]
    assert len(batches) > 1 and len({e["args"]["batch"] for e in batches}) == len(batches)
    assert 0 < sum(e["args"]["reads"] for e in spans if e["name"] == "read") <= summary["reads_in"]
    assert all(e["dur"] >= 0 for e in spans)
    memory = [sum(e["args"].values()) for e in events if e["name"] == "memory MB"]  # summed PSS, this process and others
    assert memory and 0 < max(memory) <= summary["peak_memory_mb"] + 1
    assert "peak memory:" in small.stderr
    bad = streamer("call", "-r", ECOLI / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE,
                   "--memory-budget", "lots")
    assert bad.returncode != 0 and "not a size: 'lots'" in bad.stderr and "Traceback" not in bad.stderr
