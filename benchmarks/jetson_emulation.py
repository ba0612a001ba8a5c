"""A Jetson beside a GridION, emulated on a GPU machine: does the daemon keep up with five flow cells while a
basecaller shares the GPU (issue 27)?

Assumptions: 4 x86 cores (`taskset -c 0-3`) stand for the 6-8 slower Arm cores of an Orin NX or AGX
Orin less the two MinKNOW keeps; the GPU is capped at 3 GB (`--gpu-memory`) and host and GPU share one
6 GB budget (`--memory-budget`, the `jetson-orin-nx` profile: unified memory, low-priority streams,
a reserve for the basecaller); the daemon runs at nice 10 and idle-ish IO priority, as the systemd
unit of a board sets it. A GridION's pace is five flow cells at about 1 Mbases/s together, each
written as MinKNOW does (POD5 + FASTQ + aligned BAM per batch file), moved in by `streamer replay`
from runs staged beforehand, the cells started in turn within one file's time (their files land
apart, not five at once). The stand-in basecaller (`standin_basecaller.py`, pinned to cores the
daemon does not use) is a loop of matrix products and a pause: its period is measured alone, then
beside the daemon.

Steps of `run`: (0) the data, prepared unless in place (`emulation_data.py`); (1) `streamer call` on
the same reads (the reference rows; it also compiles the kernels into numba's cache); (2) the stand-in
alone; (3) the daemon following the replay, the stand-in beside it: host PSS of the daemon's processes
and its GPU memory (nvidia-smi) sampled every second; the backlog (reads landed less reads done) every
50 ms from its ledger's commits, counted from when the files really landed (their renames into the
live folder, against the plan: the replays' start-up); then its latency per batch file (from the
file's landing, and from its registration in the ledger, which leaves out any wait to be taken in),
its rows against (1); (4) with
`--search`, the same at faster paces until one is not kept. Writes OUT/results.json and
OUT/results.md. The GPU memory counted is all the daemon's process holds on the device, its CUDA
context included, and the budget plans for the HMM kernel's local memory on every thread the device
holds: 1.45 GB on an H100's 132 SMs, about 70 MB on an Orin NX's 8, so the H100 leaves the batches
less of the 6 GB than a board would.

    # on any machine, ahead (CPU only; `.devdata/` is git-ignored), for --duration 60 at 1 Mbases/s:
    python benchmarks/jetson_emulation.py prepare --data .devdata/ecoli_2kb_region --mbases 60
    # on the GPU machine (about 6 minutes with these; --duration 300 is the issue's test, 300 Mbases):
    python benchmarks/jetson_emulation.py run --data .devdata/ecoli_2kb_region --duration 60 \
        --search 2,4,8 --out bench-work/jetson

With `--basecalls fastq` (to `prepare` and `run` alike: its data are a folder of their own) the runs
are staged as MinKNOW writes them basecalled without alignment, POD5 and FASTQ per batch file and no
BAM, and the daemon aligns the reads itself with `--align-engine` (mappy, cpu, gpu; auto by default);
the rows are still compared with `streamer call` on the BAM, their differences counted. Each trial
reports the daemon's time per batch from its ledger (taking the basecalls, aligning them, the stages,
the commit), every batch's kept in results.json:

    python benchmarks/jetson_emulation.py run --data .devdata/ecoli_2kb_region --duration 66 \
        --basecalls fastq --align-engine gpu --out bench-work/jetson-fastq-gpu   # and mappy

`--data` is a copy of the shared `ecoli_2kb_region` folder. The data take about 17 MB per Mbase
(60 Mbases: 1 GB; 300: 5 GB) and were written at 0.4 Mbases/s on 2 busy cores. Every core writes
a cell's POD5 parts and stages its batches (one cell of 4.9 Mbases on 2 cores: 4.3 s, against 6.7 s
with a process per cell): `run` prepares whatever is not in `--work` yet itself, so on a machine with
more cores the data need not travel. `run` takes `--standin-s 0` to measure the daemon without the
stand-in. Each step's numbers are in results.json as soon as it ends; the daemons' logs, summaries
and ledgers stay in OUT/main and OUT/pace*.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streamer.summary import tree_pss  # noqa: E402
from common import streamer  # noqa: E402
from emulation_data import PREP, copies_for, prepare  # noqa: E402
from emulation_report import (backlog, batch_latency, batch_times, file_latencies, growth, landing_latencies, lateness,  # noqa: E402
                               landings, latency_summary, markdown, peak_memory, period_change, progress, row_difference, stagger,
                               sustained)
from streamer.align import ENGINES  # noqa: E402
from streamer.daemon.replay_plan import BatchTiming, ReplayOptions, landing_times  # noqa: E402

HERE = Path(__file__).resolve().parent
REFERENCE = HERE.parent / "tests" / "data" / "ecoli_k12_mg1655.fa.gz"
WORK = HERE.parent / ".devdata" / "jetson"


def pinned(cores: str, nice: bool = False) -> list[str]:
    """The command prefix that keeps a process on `cores` (and at the board's nice and IO class)."""
    out = ["taskset", "-c", cores] if shutil.which("taskset") else []
    if nice:
        out += ["nice", "-n", "10"] + (["ionice", "-c", "2", "-n", "7"] if shutil.which("ionice") else [])
    return out


def gpu_memory_by_pid() -> dict[int, int]:
    """Device bytes each process holds (nvidia-smi); empty without it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    pids = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().isdigit():
            pids[int(pid)] = int(mib) << 20
    return pids


def start_standin(args, out: Path, calibrate: bool, repeats: int = 0, pause_ms: float = 0.0) -> subprocess.Popen:
    """The stand-in basecaller on the other cores, once it has begun its loop."""
    tune = ["--calibrate", str(args.duty), "--period-ms", str(args.period_ms)] if calibrate else [
        "--repeats", str(repeats), "--pause-ms", str(pause_ms)]
    proc = subprocess.Popen([*pinned(args.other_cores), sys.executable, str(HERE / "standin_basecaller.py"),
                             "--seconds", "100000", "--size", str(args.size), "--out", str(out), *tune],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    proc.stdout.readline()  # its first line comes as its loop begins
    return proc


def stop_standin(proc: subprocess.Popen, out: Path) -> dict:
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return json.loads(out.read_text())


def landed_at(paths: Mapping[int, str]) -> dict[int, float]:
    """When each file landed in the live folder (wall clock): its inode's change time, which the replay's
    rename into place sets and nothing after it touches (a file system that kept it from the staging link
    would give an earlier time: a longer latency, never a shorter one)."""
    return {i: os.stat(path).st_ctime for i, path in paths.items()}


def trial(args, root: Path, prep: dict, pace: float, out: Path, standin: dict | None) -> dict:
    """The daemon following the staged cells at `pace` Mbases/s, sampled; the stand-in beside it if given."""
    live, results = out / "live", out / "daemon"
    shutil.rmtree(out, ignore_errors=True)
    names = [c["name"] for c in prep["cells"]]
    for name in names:
        (live / name).mkdir(parents=True)
    watch = ["--watch", live / names[0], *(x for n in names[1:] for x in ("--watch-also", live / n))]
    log = open(out / "daemon.log", "w")
    daemon = subprocess.Popen([*pinned(args.daemon_cores, nice=True), *streamer(
        "run", *watch, "-g", root.parent / "ref.fa", "-o", results, "--profile", args.profile, "--threads",
        args.threads, "--memory-budget", args.budget, *(["--gpu-memory", args.gpu_memory] if args.gpu_memory != "none"
                                                         else []),
        "--basecalls", args.basecalls, *(["--align-engine", args.align_engine] if args.align_engine else []),
        "--status-interval", "1", "--grace", "2", *(["--trace", out / "trace.json"] if args.daemon_trace else []),
        *args.daemon_flag)],
        stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    outs = [results / n for n in names] if len(names) > 1 else [results]  # one run's outputs are not in a folder of its name
    summaries = [o / "summary.json" for o in outs]
    deadline = time.monotonic() + args.start_timeout
    while not all(p.exists() for p in summaries):  # written once the daemon watches its runs
        if daemon.poll() is not None or time.monotonic() > deadline:
            daemon.kill()
            raise SystemExit(f"the daemon did not start: see {out / 'daemon.log'}")
        time.sleep(0.5)
    beside = None
    if standin is not None:
        beside = start_standin(args, out / "standin.json", False, standin["repeats"], standin["pause_ms"])
    offsets = stagger(prep["cells"], pace)
    replays: dict[int, subprocess.Popen] = {}

    def replay(i: int) -> None:
        replays[i] = subprocess.Popen([*pinned(args.other_cores), *streamer(
            "replay", prep["cells"][i]["staged"], live, "--keep-staged", "--mbases-per-s", pace / len(names))],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip

    t0, wall0, samples = time.monotonic(), time.time(), []
    for i, at in enumerate(offsets):
        threading.Timer(at, replay, (i,)).start()
    landed = landings(prep["cells"], pace, offsets)
    deadline = t0 + landed[-1][0] + args.drain_timeout

    while daemon.poll() is None and time.monotonic() < deadline:  # its memory; its progress is the ledger's
        samples.append({"pss": tree_pss(daemon.pid), "gpu": gpu_memory_by_pid().get(daemon.pid, 0)})
        time.sleep(args.sample_s)
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
    code = daemon.wait(120)
    log.close()
    while len(replays) < len(offsets):  # a daemon that failed early: every replay still runs to its end
        time.sleep(0.1)
    paces = [replays[i].communicate()[1].strip().splitlines()[-2:] for i in range(len(offsets))]
    arena = [line.split("] ")[-1] for line in (out / "daemon.log").read_text().splitlines() if "arena" in line]
    files, from_landing, late, batches, times, commits = [], [], [], [], [], []
    for o, cell, at in zip(outs, prep["cells"], offsets):
        planned = landing_times([BatchTiming(0.0, b) for b in cell["bases"]],
                                ReplayOptions(mbases_per_s=pace / len(names)))  # as `landings`, per cell
        with contextlib.closing(sqlite3.connect(o / ".streamer" / "ledger.sqlite")) as db:
            registered = dict(db.execute("SELECT id, at FROM files"))
            paths = dict(db.execute("SELECT id, path FROM files"))
            committed = dict(db.execute("SELECT id, at FROM batches"))
            reads = db.execute("SELECT signal_file, basecall_file, batch FROM reads WHERE batch IS NOT NULL").fetchall()
            landed_files = landed_at({sig: paths[sig] for sig in {r[0] for r in reads}})
            files += file_latencies(reads, registered, committed)
            from_landing += landing_latencies(reads, landed_files, committed)
            late += lateness(landed_files, paths, [wall0 + at + t for t in planned])
            batches += db.execute("SELECT n_reads, latency_sum, latency_max FROM batches").fetchall()
            times += db.execute("SELECT n_reads, bases, seconds FROM batches ORDER BY id").fetchall()
            commits += [(at - wall0, n) for at, n in db.execute("SELECT at, n_reads FROM batches")]
    skew = statistics.fmean(late) if late else 0.0  # the replays' start-up: times counted from their files
    series = backlog(progress([(t - skew, n) for t, n in commits]), landed)
    bases = sum(json.loads(p.read_text())["bases"] for p in summaries)
    limits = json.loads(summaries[0].read_text())["profile"]
    rows = sorted(line for o in outs for line in (o / "meth.tsv").read_text().splitlines()[1:])
    return {"pace": pace, "exit": code, "replays": paces, "replay_skew_s": skew, "arena": arena,
            "growth": growth(series, landed), "backlog": series,
            "latency": batch_latency(files, batches), "landing_latency": latency_summary(from_landing),
            "batch_times": batch_times(times),
            "alignment_engine": json.loads(summaries[0].read_text()).get("alignment_engine"),
            "memory": peak_memory(samples, limits["limits"]["memory_budget"], limits["limits"]["unified_memory"]),
            "limits": limits, "rows": len(rows), "rows_list": rows,
            "read_latency_s": [json.loads(p.read_text())["latency_s"] for p in summaries],
            "mbases": bases / 1e6,
            "standin": stop_standin(beside, out / "standin.json") if beside else None}  # fmt: skip


def call_tsv(root: Path) -> Path:
    """`streamer call` on all cells' reads at once, made once per prepared data set (`prepare` makes it
    too, so a short device session can prepare in one command and replay in the next)."""
    out = root / "call.tsv"
    if not out.exists():
        ref = root.parent / "ref.fa"
        if not ref.exists():
            ref.write_bytes(gzip.decompress(REFERENCE.read_bytes()))
        joint = root / "all"
        subprocess.run(streamer("call", "-r", joint / "reads.fasta", "-b", joint / "reads.bam", "-g", ref, "--signal",
                                joint / "pod5", "-o", root / "call.partial.tsv"), check=True,
                       stderr=open(root / "call.log", "w"))  # fmt: skip
        (root / "call.partial.tsv").rename(out)
    return out


def run(args) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict = {"cells": args.cells, "daemon_cores": args.daemon_cores, "profile": args.profile,
                 "budget": args.budget, "gpu_memory": args.gpu_memory, "device": _device(),
                 "basecalls": args.basecalls, "align_engine": args.align_engine}  # fmt: skip

    def save() -> None:
        (args.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")

    t0 = time.perf_counter()
    root = prepare(args.data, args.work, args.cells, copies_for(args.pace * args.duration, args.cells, args.data),
                   args.file_reads, args.basecalls)  # fmt: skip
    prep = json.loads((root / PREP).read_text())
    res["prepare_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    call_rows = sorted(call_tsv(root).read_text().splitlines()[1:])
    res["call_s"] = time.perf_counter() - t0
    alone = None
    if args.standin_s > 0:
        proc = start_standin(args, args.out / "standin_alone.json", True)
        time.sleep(args.standin_s)
        alone = stop_standin(proc, args.out / "standin_alone.json")
    save()
    main = trial(args, root, prep, args.pace, args.out / "main", alone)
    rows = main.pop("rows_list")
    main["rows_identical"], main["rows_diff"] = rows == call_rows, row_difference(rows, call_rows)
    beside = main.pop("standin")
    res["standin"] = {"alone": alone, "beside": beside, "change": period_change(alone, beside)} if alone else None
    res["main"] = main
    save()
    res["search"], res["largest_pace"] = [], args.pace if _kept(main, args) else None
    for pace in args.search:
        t = trial(args, root, prep, pace, args.out / f"pace{pace:g}", alone)
        t.pop("rows_list")
        t["sustained"] = _kept(t, args)
        res["search"].append(t)
        save()
        if not t["sustained"]:
            break
        res["largest_pace"] = pace
    save()
    (args.out / "results.md").write_text(markdown(res))
    return res


def _kept(t: dict, args) -> bool:
    return sustained(t["growth"], max(args.drain_s, 0.1 * t["growth"]["landing_s"]))


def _device() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        out = "no nvidia-smi"
    return f"{out}; {os.cpu_count()} cores"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="step", required=True)
    for name in ("prepare", "run"):
        p = sub.add_parser(name)
        p.add_argument("--data", type=Path, required=True, help="the shared ecoli_2kb_region folder")
        p.add_argument("--work", type=Path, default=WORK, help="where the replay data goes [%(default)s]")
        p.add_argument("--cells", type=int, default=5, help="flow cells [%(default)s: a GridION]")
        p.add_argument("--file-reads", type=int, default=400, help="reads per batch file [%(default)s]")
        p.add_argument("--basecalls", choices=("bam", "fastq"), default="bam",
                       help="bam: aligned BAMs staged beside the POD5 and FASTQ, the daemon reads them; fastq: FASTQ "
                            "only, the daemon aligns the reads itself (--align-engine) [%(default)s]")
    prep = sub.choices["prepare"]
    prep.add_argument("--mbases", type=float, default=300.0, help="Mbases in all [%(default)s: 300 s at 1 Mbases/s]")
    r = sub.choices["run"]
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--duration", type=float, default=300.0, help="seconds of replay at --pace [%(default)s]")
    r.add_argument("--pace", type=float, default=1.0, help="Mbases/s of all cells together [%(default)s]")
    r.add_argument("--search", type=lambda s: [float(x) for x in s.split(",") if x], default=[],
                   help="faster paces to try in turn until one is not kept, e.g. 2,4,8 (the same reads, faster)")
    r.add_argument("--daemon-cores", default="0-3")
    r.add_argument("--other-cores", default="4-15", help="the replays' and the stand-in's [%(default)s]")
    r.add_argument("--threads", type=int, default=4)
    r.add_argument("--align-engine", choices=ENGINES, help="the daemon's `--align-engine` [its default]")
    r.add_argument("--profile", default="jetson-orin-nx")
    r.add_argument("--budget", default="6G", help="host and GPU together, or `auto`: the profile's [%(default)s]")
    r.add_argument("--daemon-flag", action="append", default=[], metavar="FLAG",
                   help="one more flag of the daemon's `streamer run`, as --daemon-flag=--cuda-events (repeatable)")
    r.add_argument("--daemon-trace", action="store_true",
                   help="the daemon writes its timeline (`streamer run --trace`) to OUT/trace.json")
    r.add_argument("--gpu-memory", default="3G", help="the GPU cap (`none`: no cap, the profile's share) [%(default)s]")
    r.add_argument("--standin-s", type=float, default=30.0,
                   help="seconds of the stand-in alone [%(default)s]; 0: no stand-in, the daemon alone on the GPU")
    r.add_argument("--size", type=int, default=1024, help="the stand-in's matrix side [%(default)s]")
    r.add_argument("--period-ms", type=float, default=100.0, help="the stand-in's period alone [%(default)s]")
    r.add_argument("--duty", type=float, default=0.5, help="share of that period its GPU work takes [%(default)s]")
    r.add_argument("--sample-s", type=float, default=1.0)
    r.add_argument("--start-timeout", type=float, default=600.0, help="seconds for the daemon to start watching")
    r.add_argument("--drain-timeout", type=float, default=180.0, help="seconds after the last file [%(default)s]")
    r.add_argument("--drain-s", type=float, default=15.0,
                   help="a pace is kept if the daemon finishes within this (or 10%% of the replay) after the last file")
    args = ap.parse_args()
    if args.step == "prepare":
        copies = copies_for(args.mbases, args.cells, args.data)
        root = prepare(args.data, args.work, args.cells, copies, args.file_reads, args.basecalls)
        call_tsv(root)
        print(root)
        return 0
    res = run(args)
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
