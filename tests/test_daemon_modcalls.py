"""dorado's modified-base calls in the daemon: the MM/ML tags of the run's basecall BAMs aggregated
live into `modkit.bed`, equal to `streamer pileup` over the same BAMs with the options the daemon
reports, with or without signal files, and through kill -9 and restart (each BAM counted once)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pysam
import pytest

from conftest import DATA, ECOLI, REFERENCE
from daemon_support import no_leaks  # noqa: F401 (a fixture)

TIMEOUT = 90


def streamer(*args) -> list[str]:
    return [sys.executable, "-m", "streamer", *map(str, args)]


@pytest.fixture(scope="module")
def modbam(tmp_path_factory) -> Path:
    """A modBAM of the fixture's reads: `streamer call --modbam` (MM/ML tags as dorado writes them)."""
    d = tmp_path_factory.mktemp("call")
    subprocess.run(streamer("call", "-r", ECOLI / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE,
                            "--signal", ECOLI / "fast5", "-o", d / "meth.tsv", "--modbam", d / "mod.bam"),
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    return d / "mod.bam"


def finished_run(tmp_path: Path, modbam: Path) -> Path:
    run = tmp_path / "finished"
    shutil.copytree(ECOLI / "fast5", run / "fast5")
    shutil.copy(ECOLI / "reads.fasta", run)
    shutil.copy(modbam, run / "reads.bam")
    return run


def daemon_flags(live: Path, out: Path, *extra) -> list:
    return ["--watch", live, "-g", REFERENCE, "-o", out, "--settle", "0.3", "--poll-interval", "0.1", "--grace", "1",
            "--max-wait", "0.2", "-K", "1", *extra]


def pileup(bams: list[Path], options: str, out: Path) -> str:
    subprocess.run(streamer("pileup", *bams, "--ref", REFERENCE, *options.split(), "-o", out), check=True,
                   capture_output=True, timeout=300)
    return out.read_text()


def check_table(out: Path, live: Path, tmp_path: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())["modcalls"]
    bams = sorted(live.rglob("*.bam"))
    want = pileup(bams, summary["pileup_options"], tmp_path / "offline.bed")
    assert want.count("\n") > 100
    assert (out / "modkit.bed").read_text() == want
    assert summary["files"] == len(bams) and summary["unreadable_files"] == 0
    return summary


def test_live_table_equals_streamer_pileup_with_the_estimated_threshold(modbam, tmp_path):
    run = finished_run(tmp_path, modbam)
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    rep = subprocess.run(streamer("replay", run, live, "--interval", "0", "--batch-size", "3"), timeout=TIMEOUT,
                         capture_output=True)
    assert rep.returncode == 0
    proc = subprocess.run(streamer("run", *daemon_flags(live, out)), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    summary = check_table(out, live, tmp_path)
    assert summary["pileup_options"].startswith("--cpg --filter-threshold 0.0 --filter-threshold C:")
    assert len([line for line in proc.stderr.splitlines() if "pass thresholds estimated" in line]) == 1
    assert "estimated pass threshold" not in proc.stderr  # said once, in the line above


def split_bam(modbam: Path, folder: Path, per_file: int = 3) -> list[Path]:
    """The modBAM as MinKNOW's batch files in `folder` (written aside, then renamed in)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    with pysam.AlignmentFile(str(modbam), "rb") as src:
        records = list(src.fetch(until_eof=True))
        for i in range(0, len(records), per_file):
            tmp = folder.parent / f".batch_{i}.bam"
            with pysam.AlignmentFile(str(tmp), "wb", header=src.header) as dst:
                for rec in records[i:i + per_file]:
                    dst.write(rec)
            out.append(tmp)
    return out


def test_without_signal_files_and_with_fixed_options(modbam, tmp_path):
    """Only `bam_pass/` (no signal): the calls are counted all the same; options as configured."""
    live, out = tmp_path / "live", tmp_path / "out"
    for f in split_bam(modbam, live / "bam_pass"):
        f.rename(live / "bam_pass" / f.name.lstrip("."))
    (live / "final_summary_x.txt").write_text("done\n")
    proc = subprocess.run(streamer("run", *daemon_flags(live, out, "--mod-filter-threshold", "0.6",
                                                        "--mod-combine-strands")),
                          capture_output=True, text=True, timeout=TIMEOUT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = check_table(out, live, tmp_path)
    assert summary["pileup_options"] == "--cpg --combine-strands --filter-threshold 0.6"


def test_a_restart_takes_the_counts_from_the_checkpoint_and_counts_only_new_bams(modbam, tmp_path):
    live, out = tmp_path / "live", tmp_path / "out"
    files = split_bam(modbam, live / "bam_pass")
    for f in files[:-1]:
        f.rename(live / "bam_pass" / f.name.lstrip("."))
    (live / "final_summary_x.txt").write_text("done\n")
    first = subprocess.run(streamer("run", *daemon_flags(live, out)), capture_output=True, text=True, timeout=TIMEOUT)
    assert first.returncode == 0, first.stderr
    assert (out / ".streamer" / "modkit-counts.pickle").exists()
    files[-1].rename(live / "bam_pass" / files[-1].name.lstrip("."))
    again = subprocess.run(streamer("run", *daemon_flags(live, out)), capture_output=True, text=True, timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr
    assert f"the counts of {len(files) - 1} BAMs restored from the checkpoint" in again.stderr
    counted = [line for line in again.stderr.splitlines() if "counted into modkit.bed" in line]
    assert len(counted) == 1 and files[-1].name.lstrip(".") in counted[0]
    check_table(out, live, tmp_path)


def test_kill_9_and_restart_count_each_bam_once(modbam, tmp_path):
    seed = int(os.environ.get("STREAMER_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    run = finished_run(tmp_path, modbam)
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    rep = subprocess.Popen(streamer("replay", run, live, "--interval", "0.5", "--batch-size", "1"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = open(tmp_path / "daemon.log", "w+")
    procs = [rep]
    try:
        for _ in range(4):
            proc = subprocess.Popen(streamer("run", *daemon_flags(live, out)), stdout=log, stderr=subprocess.STDOUT)
            procs.append(proc)
            deadline = time.monotonic() + TIMEOUT
            while not (out / ".streamer" / "ledger.sqlite").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 2.0))
            if proc.poll() is not None:
                break
            proc.kill()
            proc.wait()
        assert rep.wait(TIMEOUT) == 0
        proc = subprocess.Popen(streamer("run", *daemon_flags(live, out)), stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        assert proc.wait(TIMEOUT * 2) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        log.seek(0)
        text = log.read()
        log.close()
    assert "Traceback" not in text
    check_table(out, live, tmp_path)
    assert text.count("pass thresholds estimated") == 1, f"seed {seed}"


def bed_sites(path: Path) -> dict:
    """modkit.bed as `meth.freq` sites (source dorado): what a subscriber's table must hold."""
    sites = {}
    for line in path.read_text().splitlines():
        f = line.replace(" ", "\t").split("\t")
        valid, nmod, *rest = map(int, [f[9], *f[11:18]])
        sites["dorado", f[0], int(f[1]), int(f[2]), f[5], f[3]] = (1, valid, nmod, "", *rest)
    return sites


def test_subscribers_and_a_late_joiner_reach_the_table(modbam, reference_path, tmp_path, no_leaks):  # noqa: F811
    from streams import local_config

    from daemon_support import FakePipeline
    from streamer.publish.client import FreqUpdate
    from streamer.daemon.shell import Daemon
    from streamer.io.reference import Reference
    from streamer.publish import Publisher
    from test_daemon import make_config
    from test_stream_run import _Collector

    cfg = make_config(tmp_path, reference_path, **{"modcalls.filter_threshold": ["0.6"]})
    live = tmp_path / "live"
    files = split_bam(modbam, live / "bam_pass", per_file=2)
    with Publisher(local_config()) as pub, Reference(reference_path) as reference:
        early = _Collector(pub.endpoints[0], ["meth.freq", "run"])
        early.start()
        assert early.synced.wait(30)
        daemon = Daemon(cfg, FakePipeline(), reference, publisher=pub)
        codes = []
        runner = threading.Thread(target=lambda: codes.append(daemon.run()), name="daemon")
        runner.start()
        try:
            for f in files[:2]:
                f.rename(live / "bam_pass" / f.name.lstrip("."))
            deadline = time.monotonic() + TIMEOUT
            while daemon.ledger is None or daemon.ledger.modcall_counts()["files"] < 2:
                assert time.monotonic() < deadline, "the first two BAMs counted"
                time.sleep(0.05)
            late = _Collector(pub.endpoints[0], ["meth.freq"])
            late.start()
            assert late.synced.wait(30)
            for f in files[2:]:
                f.rename(live / "bam_pass" / f.name.lstrip("."))
            (live / "final_summary_x.txt").write_text("done\n")
            runner.join(TIMEOUT)
        finally:
            daemon.request_stop()
            runner.join(TIMEOUT)
            daemon.close()
        pub.close()
        early.join(5)
        late.join(5)
    assert codes == [0] and early.error is None and late.error is None
    want = bed_sites(cfg.output.dir / "modkit.bed")
    assert len(want) > 100
    dorado = {k: v for k, v in early.sites.items() if k[0] == "dorado"}
    assert dorado == want and {k: v for k, v in late.sites.items() if k[0] == "dorado"} == want
    # the late joiner had the first files' sites from its snapshot, the others' from updates
    assert [m for m in late.messages if isinstance(m, FreqUpdate) and "dorado" in m.sites.source.tolist()]


def strip_tags(modbam: Path, out: Path, keep=lambda i: False) -> None:
    """The modBAM with the MM/ML tags of every record but those `keep` picks removed."""
    with pysam.AlignmentFile(str(modbam), "rb") as src, pysam.AlignmentFile(str(out), "wb", header=src.header) as dst:
        for i, rec in enumerate(src.fetch(until_eof=True)):
            if not keep(i):
                rec.set_tag("MM", None)
                rec.set_tag("ML", None)
            dst.write(rec)


def test_each_bam_is_read_once_and_batches_without_tags_skip_the_kernels(modbam, tmp_path, monkeypatch):
    """A BAM is opened for its header and read through once, whether it has calls or not; batches
    without tags count as reads only, and the table still equals `streamer pileup` over the file."""
    from streamer_plugins.modbase import live, reader
    from streamer_plugins.modbase.pileup import is_used

    monkeypatch.setattr(reader, "BATCH_READS", 2)
    opened: list[str] = []
    real_open = reader._open
    monkeypatch.setattr(reader, "_open", lambda path: opened.append(Path(path).name) or real_open(path))
    untagged, mixed = tmp_path / "untagged.bam", tmp_path / "mixed.bam"
    strip_tags(modbam, untagged)
    strip_tags(modbam, mixed, keep=lambda i: i % 4 == 3)  # batches with calls between batches without
    with pysam.AlignmentFile(str(modbam), "rb") as bam:
        used = sum(1 for rec in bam.fetch(until_eof=True) if is_used(rec))

    assert live.LiveModTable(tmp_path / "a.bed", REFERENCE).estimate(untagged).per_base == {}
    assert opened == ["untagged.bam"] * 2
    opened.clear()

    table = live.LiveModTable(tmp_path / "modkit.bed", REFERENCE, no_filtering=True)
    assert table.add_file(untagged) == (used, 0)
    assert table.counts is None and opened == ["untagged.bam"] * 2  # no counts made, so no kernel ran
    opened.clear()
    reads, calls = table.add_file(mixed)
    assert opened == ["mixed.bam"] * 2
    assert reads == used and calls == table.n_calls > 0
    table.refresh()
    want = pileup([mixed], table.describe(), tmp_path / "offline.bed")
    assert want.count("\n") > 10 and (tmp_path / "modkit.bed").read_text() == want


# ---------------------------------------------------------------- a file whose calls cannot be counted


def with_extra_contig(bam: Path, out: Path) -> None:
    """`bam` (MM/ML tags kept) under an @SQ list with one more contig than the run's first BAM."""
    with pysam.AlignmentFile(str(bam), "rb") as src:
        header = src.header.to_dict()
        header["SQ"] = header["SQ"] + [{"SN": "extra_contig", "LN": 1000}]
        with pysam.AlignmentFile(str(out), "wb", header=header) as dst:
            for rec in src.fetch(until_eof=True):
                dst.write(pysam.AlignedSegment.fromstring(rec.to_string(), dst.header))


def called_reads(out: Path) -> set[str]:
    return {line.split("\t")[4] for line in (out / "meth.tsv").read_text().splitlines()[1:]}


def read_ids(bams) -> set[str]:
    ids = set()
    for bam in bams:
        with pysam.AlignmentFile(str(bam), "rb", check_sq=False) as fh:
            ids |= {rec.query_name for rec in fh.fetch(until_eof=True)}
    return ids


def not_counted(caplog, path: Path) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if "modified-base calls are not counted" in r.getMessage() and path.name in r.getMessage()]


def modcall_config(tmp_path: Path, reference_path: Path):
    from test_daemon import make_config

    return make_config(tmp_path, reference_path, **{"batch.max_reads": 2})


def test_a_bam_with_other_contigs_landing_mid_run_is_named_once_and_the_run_goes_on(
        modbam, reference_path, tmp_path, caplog, no_leaks):  # noqa: F811
    from daemon_support import FakePipeline
    from streamer.io.reference import Reference
    from test_daemon import daemon_for, run_to_end, summary

    cfg = modcall_config(tmp_path, reference_path)
    live = tmp_path / "live"
    shutil.copytree(ECOLI / "fast5", live / "fast5_pass")
    files = split_bam(modbam, live / "bam_pass")
    odd = live / "bam_pass" / "odd.bam"
    caplog.set_level("INFO")
    with Reference(reference_path) as reference:
        daemon = daemon_for(cfg, FakePipeline(), reference)
        codes = []
        runner = threading.Thread(target=lambda: codes.append(daemon.run()), name="daemon")
        runner.start()
        try:
            for f in files[:-1]:
                f.rename(live / "bam_pass" / f.name.lstrip("."))
            deadline = time.monotonic() + TIMEOUT
            while daemon.ledger is None or daemon.ledger.modcall_counts()["files"] < len(files) - 1:
                assert time.monotonic() < deadline, "the first BAMs counted"
                time.sleep(0.05)
            with_extra_contig(files[-1], tmp_path / "odd.bam")
            files[-1].unlink()
            (tmp_path / "odd.bam").rename(odd)
            (live / "final_summary_x.txt").write_text("done\n")
            runner.join(TIMEOUT)
        finally:
            daemon.request_stop()
            runner.join(TIMEOUT)
            daemon.close()
        assert codes == [0]
        assert len(not_counted(caplog, odd)) == 1 and "contigs differ" in not_counted(caplog, odd)[0]
        counts = summary(cfg)["modcalls"]
        assert counts["unreadable_files"] == 1 and counts["files"] == len(files) - 1
        good = sorted(p for p in (live / "bam_pass").iterdir() if p != odd)
        assert called_reads(cfg.output.dir) == read_ids(good + [odd])  # every read called, the odd BAM's too
        table = (cfg.output.dir / "modkit.bed").read_text()
        assert table.count("\n") > 100 and "extra_contig" not in table

        caplog.clear()
        code, _ = run_to_end(cfg, FakePipeline(), reference)  # a restart: no crash, nothing said twice
    assert code == 0 and not_counted(caplog, odd) == []
    assert summary(cfg)["modcalls"] == counts and (cfg.output.dir / "modkit.bed").read_text() == table


KILLABLE_DAEMON = """
import sys, time
sys.path[:0] = {paths!r}
from daemon_support import FakePipeline
from streamer.io.reference import Reference
from test_daemon import daemon_for, make_config
from pathlib import Path
cfg = make_config(Path({tmp!r}), Path({ref!r}), **{{"batch.max_reads": 2}})
with Reference(cfg.reference.genome) as reference:
    daemon_for(cfg, FakePipeline(), reference).run()
"""


def test_a_counted_bam_removed_across_a_kill_9_is_named_once_and_restarts_are_clean(
        modbam, reference_path, tmp_path, caplog, no_leaks):  # noqa: F811
    import sqlite3
    from contextlib import closing

    from daemon_support import FakePipeline
    from streamer.io.reference import Reference
    from test_daemon import make_config, run_to_end, summary

    live, out = tmp_path / "live", tmp_path / "out"
    shutil.copytree(ECOLI / "fast5", live / "fast5_pass")
    files = [f.rename(live / "bam_pass" / f.name.lstrip(".")) for f in split_bam(modbam, live / "bam_pass")]
    tests = str(Path(__file__).parent)
    script = KILLABLE_DAEMON.format(paths=[tests], tmp=str(tmp_path), ref=str(reference_path))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + TIMEOUT
        counted = 0
        while counted < len(files):  # every BAM counted (the run goes on: no final_summary yet)
            assert proc.poll() is None and time.monotonic() < deadline, "the BAMs counted"
            time.sleep(0.1)
            try:
                ledger = f"file:{out / '.streamer' / 'ledger.sqlite'}?mode=ro"
                with closing(sqlite3.connect(ledger, uri=True)) as db:
                    counted = db.execute("SELECT count(*) FROM modcalls WHERE n_calls > 0").fetchone()[0]
            except sqlite3.Error:
                counted = 0
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    assert not (out / ".streamer" / "modkit-counts.pickle").exists()  # a kill -9 leaves no checkpoint
    gone = files[0]
    gone.unlink()
    (live / "final_summary_x.txt").write_text("done\n")
    cfg = make_config(tmp_path, reference_path, **{"batch.max_reads": 2})
    caplog.set_level("INFO")
    with Reference(reference_path) as reference:
        code, _ = run_to_end(cfg, FakePipeline(), reference)
        assert code == 0
        assert len(not_counted(caplog, gone)) == 1
        counts = summary(cfg)["modcalls"]
        assert counts["unreadable_files"] == 1 and counts["files"] == len(files) - 1
        assert called_reads(out) >= read_ids(files[1:])  # every read of the other BAMs called
        caplog.clear()
        code, _ = run_to_end(cfg, FakePipeline(), reference)
    assert code == 0 and not_counted(caplog, gone) == []
    assert summary(cfg)["modcalls"] == counts


def test_a_bam_without_calls_counts_its_reads_as_the_table_does(tmp_path):
    """The daemon reads a BAM through once off its engine (`tagless_reads`); the table reads only those with calls."""
    from streamer_plugins.modbase.live import LiveModTable, tagless_reads

    table = LiveModTable(tmp_path / "modkit.bed", REFERENCE, no_filtering=True)
    assert tagless_reads(ECOLI / "reads.bam") == table.add_file(ECOLI / "reads.bam")[0] > 0
    assert tagless_reads(DATA / "modbase" / "small.bam") is None
