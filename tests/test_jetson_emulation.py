"""The parts of benchmarks/jetson_emulation.py that run without a GPU: its replay data prepared (a tiny
configuration of the shared reads), the backlog, latency and memory made of a trial's samples, the
markdown table, and the stand-in basecaller's loop under numba's CUDA simulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pysam
import pytest

from conftest import ROOT, SHARED, needs_shared

sys.path.insert(0, str(ROOT / "benchmarks"))
from emulation_data import PREP, consecutive_ranges, copies_for, prepare  # noqa: E402
from emulation_report import (backlog, batch_latency, batch_times, file_latencies, growth, landing_latencies, lateness,  # noqa: E402
                              landings, latency_summary, markdown, peak_memory, period_change, progress, row_difference,
                              stagger,
                              sustained)

CELLS = [{"name": f"fc{c}", "bases": [500_000] * 10, "reads": [100] * 10} for c in range(2)]


@needs_shared
def test_prepare_writes_staged_cells_and_the_joint_input_once(tmp_path):
    root = prepare(SHARED, tmp_path, cells=2, copies=1, file_reads=50)
    info = json.loads((root / PREP).read_text())
    assert len(info["cells"]) == 2 and len({c["name"] for c in info["cells"]}) == 2
    for cell in info["cells"]:
        staged = Path(cell["staged"])
        manifest = json.loads((staged / ".replay.json").read_text())
        assert [b["bases"] for b in manifest["batches"]] == cell["bases"] and manifest["bam"]
        assert sum(cell["reads"]) == 112 and max(cell["reads"]) == 50  # every shared read once per copy
    joint = root / "all"
    with pysam.FastxFile(str(joint / "reads.fasta")) as fa:
        ids = [r.name for r in fa]
    assert len(ids) == len(set(ids)) == 224  # copies never repeat across cells
    with pysam.AlignmentFile(str(joint / "reads.bam")) as bam:
        assert {r.query_name for r in bam} <= set(ids)
    parts = sorted(p.name for p in (joint / "pod5").iterdir())
    assert parts == ["fc0_part0000.pod5", "fc1_part0000.pod5"]  # one copy per cell: one part each
    stamp = (root / PREP).stat().st_mtime_ns
    assert prepare(SHARED, tmp_path, cells=2, copies=1, file_reads=50) == root  # in place: not written again
    assert (root / PREP).stat().st_mtime_ns == stamp
    assert copies_for(60, 5, SHARED) == 20  # 60 Mbases of 0.62-Mbase copies over five cells


def test_a_cells_copies_are_cut_into_consecutive_parts_in_order():
    assert consecutive_ranges(10, 5, 2) == [(10, 12), (13, 14)]
    assert consecutive_ranges(0, 3, 8) == [(0, 0), (1, 1), (2, 2)]  # never an empty part
    assert consecutive_ranges(4, 7, 1) == [(4, 10)]


@needs_shared
def test_prepare_fastq_stages_no_bams(tmp_path):
    """`--basecalls fastq`: a folder of its own, POD5 and FASTQ per batch file, no BAM (the daemon aligns)."""
    root = prepare(SHARED, tmp_path, cells=1, copies=1, file_reads=50, basecalls="fastq")
    assert root.name.endswith("_fastq")
    staged = Path(json.loads((root / PREP).read_text())["cells"][0]["staged"])
    manifest = json.loads((staged / ".replay.json").read_text())
    assert not manifest["bam"] and all(set(b["files"]) == {"signal", "fastq"} for b in manifest["batches"])
    assert not (staged / "bam_pass").exists() and len(list((staged / "fastq_pass").iterdir())) == 3
    assert (root / "all" / "reads.bam").is_file()  # `streamer call`'s input, the reference rows


def test_landings_follow_the_replay_pace():
    landed = landings(CELLS, 1.0)  # two cells at 0.5 Mbases/s each: a 0.5-Mbase file a second from each
    assert landed[:4] == [(1.0, 100), (1.0, 100), (2.0, 100), (2.0, 100)] and landed[-1] == (10.0, 100)
    offsets = stagger(CELLS, 1.0)  # the cells' files in turn: the second cell half a file later
    assert offsets == [0.0, 0.5]
    assert landings(CELLS, 1.0, offsets)[:3] == [(1.0, 100), (1.5, 100), (2.0, 100)]


def _a_second_behind() -> list[dict]:
    """Samples every half second of a daemon that has done, at each, what had landed a second before."""
    return [{"t": k / 2, "done": min(2000, max(0, 200 * int(k / 2) - 200))} for k in range(29)]


def test_progress_is_rebuilt_from_the_commits_at_every_step():
    done = progress([(0.12, 30), (0.02, 10), (0.12, 5)], step=0.05)
    assert [p["t"] for p in done] == pytest.approx([0.0, 0.05, 0.1, 0.15])
    assert [p["done"] for p in done] == [0, 10, 10, 45]  # two commits at 0.12 s both counted by 0.15 s
    assert [p["done"] for p in progress([])] == [0, 0]  # no commits: none done


def test_a_daemon_that_keeps_up_has_no_growing_backlog():
    landed = landings(CELLS, 1.0)
    series = backlog(_a_second_behind(), landed)
    assert series[4] == {"t": 2.0, "landed": 400, "done": 200, "backlog": 200}
    g = growth(series, landed)
    assert not g["grows"] and g["landing_reads_per_s"] == 200 and g["drain_s"] == 1.0 and g["max_backlog"] == 200
    assert sustained(g, 5.0) and not sustained(g, 0.5)


def test_a_daemon_at_half_the_pace_has_a_growing_backlog_and_no_finish():
    landed = landings(CELLS, 1.0)
    slow = [{"t": t / 2, "done": 50 * t} for t in range(0, 29)]  # 100 reads/s of the 200 landing
    g = growth(backlog(slow, landed), landed)
    assert g["grows"] and g["slope_reads_per_s"] == pytest.approx(100) and g["drain_s"] is None
    assert not sustained(g, 1e9)


def test_latency_memory_and_period_summaries():
    # the ledger's rows: reads (signal file, basecall file, batch), files' and batches' times
    reads = [(1, 2, 10), (1, 2, 11), (3, 4, 11)]
    files = file_latencies(reads, {1: 100.0, 2: 101.0, 3: 102.0, 4: 100.5}, {10: 104.0, 11: 106.0})
    assert sorted(files) == [4.0, 5.0]  # file 1 waits for its last read's batch, from its basecalls' landing
    names = {1: "/live/fc0/pod5_pass/FAK1_pass_ab_cd_1.pod5", 3: "/live/fc0/pod5_pass/FAK1_pass_ab_cd_0.pod5"}
    at = {1: 99.5, 3: 99.0}  # files 1 and 0 of the cell landed at 99.5 and 99
    landed = landing_latencies(reads, at, {10: 104.0, 11: 106.0})
    assert sorted(landed) == [6.5, 7.0]  # from its landing: file 1 (first field) at 99.5, its last read at 106
    assert sorted(lateness(at, names, [98.75, 99.0])) == [0.25, 0.5]  # each against the plan for its number
    assert latency_summary(landed) == {"files": 2, "mean_s": 6.75, "max_s": 7.0}
    lat = batch_latency(files, [(2, 6.0, 4.0), (4, 4.0, 1.5)])
    assert lat == {"files": 2, "mean_s": 4.5, "max_s": 5.0, "batches": 2, "batch_mean_s": 2.0, "batch_max_s": 4.0}
    samples = [{"pss": 2 << 30, "gpu": 3 << 30}, {"pss": 3 << 30, "gpu": 1 << 30}]
    mem = peak_memory(samples, 6 << 30, unified=True)
    assert (mem["host_pss_mb"], mem["gpu_mb"], mem["sum_mb"], mem["within_budget"]) == (3072, 3072, 5120, True)
    assert not peak_memory(samples, 4 << 30, unified=True)["within_budget"]
    assert peak_memory(samples, 4 << 30, unified=False)["within_budget"]  # beside a GPU of its own: the host's
    times = batch_times([(100, 400_000, 2.0), (50, 200_000, 1.0), (100, 400_000, 4.0), (10, 40_000, 1.0)])
    assert {k: times[k] for k in ("batches", "reads", "total_s", "mean_s", "p50_s", "p90_s", "max_s")} == {
        "batches": 4, "reads": 260, "total_s": 8.0, "mean_s": 2.0, "p50_s": 2.0, "p90_s": 4.0, "max_s": 4.0}
    assert times["mbases_per_s"] == pytest.approx(0.13) and times["per_batch"][1] == [50, 200_000, 1.0]
    assert batch_times([])["batches"] == 0 and batch_times([])["mbases_per_s"] == 0.0
    assert row_difference(["a", "b", "b"], ["b", "c"]) == {"daemon_only": 2, "call_only": 1}
    alone = {"period": {"mean_ms": 100.0, "p50_ms": 100.0, "p99_ms": 110.0}}
    beside = {"period": {"mean_ms": 105.0, "p50_ms": 100.0, "p99_ms": 132.0}}
    assert period_change(alone, beside) == pytest.approx({"mean": 0.05, "p50": 0.0, "p99": 0.2})


def test_markdown_table_of_a_run():
    landed = landings(CELLS, 1.0)
    g = growth(backlog(_a_second_behind(), landed), landed)
    period = {"mean_ms": 100.0, "p50_ms": 99.0, "p99_ms": 120.0, "max_ms": 130.0}
    latency = {"files": 20, "mean_s": 3.2, "max_s": 7.5, "batches": 8, "batch_mean_s": 2.5, "batch_max_s": 6.0}
    trial = {"pace": 1.0, "mbases": 10.0, "growth": g, "latency": latency,
             "landing_latency": {"files": 20, "mean_s": 4.1, "max_s": 8.0},
             "memory": peak_memory([{"pss": 2 << 30, "gpu": 1 << 30}], 6 << 30, True), "rows_identical": True,
             "rows": 1234}  # fmt: skip
    res = {"cells": 2, "daemon_cores": "0-3", "profile": "jetson-orin-nx", "budget": "6G", "gpu_memory": "3G",
           "device": "NVIDIA H100", "main": trial,
           "standin": {"alone": {"period": period, "work": {"mean_ms": 50.0}},
                       "beside": {"period": period, "work": {"mean_ms": 51.0}},
                       "change": {"mean": 0.0, "p50": 0.0, "p99": 0.0}},
           "search": [{**trial, "pace": 2.0, "sustained": False}], "largest_pace": 1.0}  # fmt: skip
    text = markdown(res)
    assert "| latency per batch file, from its landing | mean 4.1 s, max 8.0 s |" in text
    assert "| latency per batch file, from its registration | mean 3.2 s, max 7.5 s (20 files) |" in text
    assert "| 4.1 / 8.0 s | 3.2 / 7.5 s |" in text  # the search's row
    assert "| latency per batch | mean 2.5 s, max 6.0 s (8 batches;" in text
    assert "| done while files land | 100% of the landing rate: about 1.0 Mbases/s |" in text
    half = markdown({**res, "main": {**trial, "pace": 24.0, "growth": {**g, "slope_reads_per_s": 50.0}}})
    assert "| done while files land | 75% of the landing rate: about 18.0 Mbases/s |" in half  # 150 of 200 reads/s
    assert "does not grow" in text and "| rows identical to `streamer call` | True (1234 rows) |" in text
    assert "| peak host PSS + GPU | 2048 + 1024 MB (largest sum 3072 MB against the budget's 6144: within) |" in text
    discrete = markdown({**res, "main": {**trial, "memory": peak_memory([{"pss": 3 << 30, "gpu": 8 << 30}], 4 << 30,
                                                                        False)}})  # fmt: skip
    assert "| 3072 + 8192 MB (the host's against the budget's 4096: within) |" in discrete
    assert "| beside the daemon | 100.0 ms |" in text and "Largest pace kept: 1.0 Mbases/s." in text
    assert "| 2 | " in text and "| no |" in text and "FASTQ" not in text
    fastq = {**res, "basecalls": "fastq", "align_engine": "mappy",
             "main": {**trial, "rows_identical": False, "rows_diff": {"daemon_only": 3, "call_only": 2},
                      "batch_times": batch_times([(400, 1_000_000, 2.0)]),
                      "alignment_engine": {"engine": "mappy", "why": "as asked"}}}  # fmt: skip
    text = markdown(fastq)
    assert "`--align-engine mappy`, engine mappy (as asked)" in text
    assert "| time per batch (ledger) | mean 2.00 s, p50 2.00, p90 2.00, max 2.00 s (1 batches, 400 reads;" in text
    assert "| rows identical to `streamer call` | False (1234 rows; 3 only the daemon's, 2 only call's) |" in text


def test_standin_basecaller_loop_under_the_simulator(tmp_path):
    pytest.importorskip("numba.cuda")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"} | {"NUMBA_ENABLE_CUDASIM": "1"}
    out = tmp_path / "standin.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "standin_basecaller.py"), "--seconds", "0.2",
                           "--size", "16", "--repeats", "1", "--pause-ms", "0", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[0]) == {"repeats": 1, "pause_ms": 0.0}
    got = json.loads(out.read_text())
    assert got["work"]["n"] >= 1 and len(got["cycles"]) == got["work"]["n"] and got["priority"] == "normal"
