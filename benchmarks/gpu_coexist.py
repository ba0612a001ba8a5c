"""Several flow cells on one GPU box (issue 15, points 1 and 2), on a machine with one GPU.

- `calls`: two `streamer call` processes on the same GPU at once (half the cores each), each
  output compared with a lone run's, byte for byte; a third at the same time with a tiny
  `--cuda-mem-frac`, which must say so in one line and run on the CPU with identical output;
  wall times against one process running both inputs in turn.
- `runs`: one daemon watching two finished runs at once (the replicated reads split as two flow
  cells, POD5 signal, aligned BAM basecalls): each run's calls against `streamer call` on that
  run's reads; combined throughput against one run alone; per-run latency from summary.json.

- `gpus` (a machine with several GPUs): `streamer call --cuda-dev-id all` against one GPU, output
  identical, each device's batches; a CUDA error injected on each device; `runs_all`: the
  daemon of `runs` on every GPU.

Data: the shared reads replicated (`bench_end_to_end.replicate`).

    python benchmarks/gpu_coexist.py --data shared/data/ecoli_2kb_region --work /tmp/coexist --out OUT
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_end_to_end import REFERENCE, replicate  # noqa: E402
from common import streamer  # noqa: E402


def start(args: list, log: Path) -> tuple[subprocess.Popen, float]:
    return subprocess.Popen(streamer(*args), stdout=subprocess.DEVNULL, stderr=open(log, "w")), time.perf_counter()


def finish(proc: subprocess.Popen, t0: float, log: Path) -> float:
    code = proc.wait()
    wall = time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"exit {code}: {log.read_text()[-2000:]}")
    return wall


def rows(path: Path) -> list[str]:
    return sorted(path.read_text().splitlines()[1:])


def calls_part(rep: Path, ref: Path, small: list, work: Path, half: int) -> dict:
    big = ["call", "-r", rep / "pod5" / "reads.fasta", "-b", rep / "reads.bam", "-g", ref, "-t", half]
    out: dict = {}
    lone = []
    for i in range(2):  # one process running both inputs in turn
        p, t0 = start([*big, "-o", work / f"lone{i}.tsv"], work / f"lone{i}.log")
        lone.append(finish(p, t0, work / f"lone{i}.log"))
    out["lone_s"] = lone
    out["in_turn_s"] = sum(lone)
    want = (work / "lone0.tsv").read_bytes()
    p, t0 = start([*small, "-o", work / "small_gpu.tsv"], work / "small_gpu.log")
    out["small_gpu_s"] = finish(p, t0, work / "small_gpu.log")
    t_all = time.perf_counter()
    procs = [start([*big, "-o", work / f"pair{i}.tsv"], work / f"pair{i}.log") for i in range(2)]
    # 1% of an H200's free memory is 1.4 GB: too little for batches of 400 Mbases
    tiny = start([*small, "--cuda-mem-frac", "0.01", "-B", "400000000", "-o", work / "tiny.tsv"], work / "tiny.log")
    out["pair_s"] = [finish(p, t0, work / f"pair{i}.log") for i, (p, t0) in enumerate(procs)]
    out["tiny_s"] = finish(*tiny, work / "tiny.log")
    out["together_s"] = time.perf_counter() - t_all
    out["pair_identical"] = [(work / f"pair{i}.tsv").read_bytes() == want for i in range(2)]
    out["lone_identical"] = (work / "lone1.tsv").read_bytes() == want
    out["tiny_identical_to_gpu"] = (work / "tiny.tsv").read_bytes() == (work / "small_gpu.tsv").read_bytes()
    tiny_log = (work / "tiny.log").read_text()
    out["tiny_lines"] = [line for line in tiny_log.splitlines() if "GPU" in line]
    out["tracebacks"] = sum("Traceback" in (work / f).read_text() for f in ("pair0.log", "pair1.log", "tiny.log"))
    return out


def runs_part(rep: Path, ref: Path, work: Path, threads: int, extra: tuple = (), label: str = "") -> dict:
    parts = sorted((rep / "pod5").glob("part*.pod5"))
    folders = []
    for name, mine in (("flowcellA", parts[0::2]), ("flowcellB", parts[1::2])):
        run = work / name
        (run / "pod5").mkdir(parents=True, exist_ok=True)
        (run / "bam_pass").mkdir(exist_ok=True)
        for p in mine:
            shutil.copy(p, run / "pod5" / p.name)
        shutil.copy(rep / "reads.bam", run / "bam_pass" / "reads.bam")
        (run / "final_summary_bench.txt").write_text("bench\n")
        folders.append(run)
    out: dict = {}
    for run in folders:  # what `streamer call` writes for the run's reads
        if (work / f"{run.name}.call.tsv").exists():
            continue
        p, t0 = start(["call", "-r", rep / "pod5" / "reads.fasta", "-b", rep / "reads.bam", "-g", ref, "-t", threads,
                       "--signal", run / "pod5", "-o", work / f"{run.name}.call.tsv"], work / f"{run.name}.call.log")
        out[f"{run.name}_call_s"] = finish(p, t0, work / f"{run.name}.call.log")
    common = ["-g", ref, "-t", threads, "--grace", "0.5", "--settle", "0.2", "--poll-interval", "0.2",
              "--basecalls", "bam", "-K", "512", *extra]
    alone_dir, both_dir = work / f"alone{label}", work / f"both{label}"
    p, t0 = start(["run", "--watch", folders[0], "-o", alone_dir, *common], work / f"alone{label}.log")
    out["alone_s"] = finish(p, t0, work / f"alone{label}.log")
    p, t0 = start(["run", "--watch", folders[0], "--watch-also", folders[1], "-o", both_dir, *common],
                  work / f"both{label}.log")
    out["both_s"] = finish(p, t0, work / f"both{label}.log")
    alone = json.loads((alone_dir / "summary.json").read_text())
    out["alone_bases"] = alone["bases"]
    out["alone_identical"] = rows(alone_dir / "meth.tsv") == rows(work / f"{folders[0].name}.call.tsv")
    bases = 0
    for run in folders:
        s = json.loads((both_dir / run.name / "summary.json").read_text())
        bases += s["bases"]
        out[f"{run.name}_latency_s"] = s["latency_s"]
        out[f"{run.name}_identical"] = rows(both_dir / run.name / "meth.tsv") == rows(work / f"{run.name}.call.tsv")
        out[f"{run.name}_busy_s"] = s["throughput"]["busy_s"]
    out["both_bases"] = bases
    out["alone_mbases_per_s"] = alone["bases"] / out["alone_s"] / 1e6
    out["both_mbases_per_s"] = bases / out["both_s"] / 1e6
    return out


def gpus_part(rep: Path, ref: Path, work: Path, threads: int) -> dict:
    """`--cuda-dev-id all` against one GPU, the same input; then with a CUDA error injected on each device."""
    big = ["call", "-r", rep / "pod5" / "reads.fasta", "-b", rep / "reads.bam", "-g", ref, "-t", threads, "-K", "256"]
    out: dict = {}
    for label, flags in (("one", ["--cuda-dev-id", "0"]), ("all", ["--cuda-dev-id", "all"]),
                         ("one_again", ["--cuda-dev-id", "0"]), ("all_again", ["--cuda-dev-id", "all"])):
        p, t0 = start([*big, *flags, "-o", work / f"gpus_{label}.tsv", "--stats-json", work / f"gpus_{label}.json"],
                      work / f"gpus_{label}.log")
        out[f"{label}_s"] = finish(p, t0, work / f"gpus_{label}.log")
        out[f"{label}_gpu"] = json.loads((work / f"gpus_{label}.json").read_text())["gpu"]
    want = (work / "gpus_one.tsv").read_bytes()
    out["all_identical"] = [(work / f"gpus_{x}.tsv").read_bytes() == want for x in ("all", "all_again", "one_again")]
    os.environ["STREAMER_CUDA_FAULT"] = "abea:3"  # each device's second batch of reads
    try:
        p, t0 = start([*big, "--cuda-dev-id", "all", "-o", work / "gpus_fault.tsv"], work / "gpus_fault.log")
        out["fault_s"] = finish(p, t0, work / "gpus_fault.log")
    finally:
        del os.environ["STREAMER_CUDA_FAULT"]
    out["fault_identical"] = (work / "gpus_fault.tsv").read_bytes() == want
    out["fault_lines"] = [line for line in (work / "gpus_fault.log").read_text().splitlines() if "failed" in line]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--copies", type=int, default=40)
    ap.add_argument("--parts", default="calls,runs")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    ref = args.work / "ref.fa"
    if not ref.exists():
        ref.write_bytes(gzip.decompress(REFERENCE.read_bytes()))
    cores = os.cpu_count() or 2
    rep = args.work / f"x{args.copies}"
    res: dict = {"cores": cores, "copies": args.copies}
    if not (rep / "reads.bam.bai").exists():
        rep.mkdir(parents=True, exist_ok=True)
        res["replicate"] = replicate(args.data, rep, args.copies, cores)
    small = ["call", "-r", args.data / "reads.fasta", "-b", args.data / "reads.mg1655.sorted.bam", "-g", ref,
             "-t", max(1, cores // 4), "--signal", args.data / "fast5_files"]
    for part in args.parts.split(","):
        t0 = time.perf_counter()
        try:
            if part == "calls":
                res[part] = calls_part(rep, ref, small, args.work, max(1, cores // 2))
            elif part == "runs":
                res[part] = runs_part(rep, ref, args.work, cores, ("--cuda-dev-id", "0"))
            elif part == "gpus":
                res[part] = gpus_part(rep, ref, args.work, cores)
            elif part == "runs_all":
                res[part] = runs_part(rep, ref, args.work, cores, ("--cuda-dev-id", "all"), "_all")
        except Exception as exc:  # noqa: BLE001 - reported, the other part still runs
            res[part] = {"error": str(exc)}
        print(part, f"{time.perf_counter() - t0:.0f} s", json.dumps(res[part], indent=1), flush=True)
        (args.out / "results.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
