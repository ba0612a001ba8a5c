"""Autotuning on a GPU: a run from bad settings, tuned, against the same start untuned and hand-picked settings.

1. ABEA stage, streamed: the tuner's domain (batch shape, CPU/GPU split, arena partition). The
   shared reads go through events and scaling once; batches are then cut from an endless stream
   of their copies as `streamer call` cuts them (K records or B bases) and aligned by
   `CudaAbea.align` on one arena, the tuner acting between batches as `streamer call --autotune`
   sets it up (device profile, bounds), without read-ahead (one settling batch). Runs:
     bad     the bad start (-K 32 by default: batches far too small for the GPU), untuned;
     tuned   the same start, autotuned;
     good    hand-picked: the hpc profile's K 4096, B 20 M, max-lf 3, untuned.
   Throughput: bases over the seconds spent in `align` (the stage's wall time), over the whole
   run and over its last --tail batches; the tuner's changes with their measured effects.
2. `streamer call` end to end (--call-copies N): the reads replicated N times on disk, the bad
   start untuned and autotuned, and the hand-picked settings (CpG HMM on the CPU in all three);
   wall times and outputs compared byte for byte.

    python benchmarks/bench_autotune.py --data ../shared/data/ecoli_2kb_region --out bench-work/autotune
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from streamer_gpu.abea import CudaAbea
from streamer.pipeline.abea import AbeaReads
from streamer.pipeline.gpu import CudaOptions
from streamer.pore.model import load_default_models
from streamer.tuning import Controller, Policy, Settings
from streamer.tuning.profiles import with_settings
from streamer.tuning.session import AutoTuner, prepare

sys.path.insert(0, str(Path(__file__).parent))
from bench_call import replicate  # noqa: E402
from common import STREAMER, shared_data_parser, timed_call  # noqa: E402
from bench_gpu_abea import scaled_batch  # noqa: E402

GOOD = Settings(max_reads=4096, max_bases=20_000_000)


class Stream:
    """The base records repeated without end; batches are cut from it as the assembly cuts them."""

    def __init__(self, arrays):
        self.seq, self.seq_off, self.ev_mean, self.ev_off, self.status, self.shift, self.scale = arrays
        self.n = len(self.seq_off) - 1
        self.lengths = np.diff(self.seq_off)
        self.pos = 0

    def count(self, s: Settings) -> int:
        """Records in the next batch: up to K, or until B bases (the record that crosses B is in)."""
        n = bases = 0
        while n < s.max_reads and bases < s.max_bases:
            bases += int(self.lengths[(self.pos + n) % self.n])
            n += 1
        return n

    def next(self, s: Settings):
        n = self.count(s)
        pieces, i, end = [], self.pos, self.pos + n
        while i < end:
            r = i % self.n
            j = min(end - i, self.n - r)
            pieces.append((r, r + j))
            i += j
        self.pos = end

        def flat(values, off):
            return np.concatenate([values[off[a] : off[b]] for a, b in pieces])

        def offsets(off):
            out = np.zeros(n + 1, np.int64)
            np.cumsum(np.concatenate([np.diff(off[a : b + 1]) for a, b in pieces]), out=out[1:])
            return out

        def per_read(values):
            return np.concatenate([values[a:b] for a, b in pieces])

        return (flat(self.seq, self.seq_off), offsets(self.seq_off), flat(self.ev_mean, self.ev_off),
                offsets(self.ev_off), per_read(self.status), per_read(self.shift), per_read(self.scale))  # fmt: skip


def run_stream(aligner: CudaAbea, model, base, start: Settings, batches: int, tuner: AutoTuner | None = None):
    """batches through the stage from `start` (tuned between batches when a tuner is given); one row per batch."""
    stream = Stream(base)
    aligner.retune(with_settings(aligner.options, start))
    rows = []
    for b in range(batches):
        s = tuner.settings if tuner is not None else start
        arrays = stream.next(s)
        t0 = time.perf_counter()
        _, stats = aligner.align(AbeaReads(*arrays), model)
        wall = time.perf_counter() - t0
        rows.append({"batch": b + 1, "wall_s": wall, **dataclasses.asdict(s), **dataclasses.asdict(stats)})
        if tuner is not None:
            tuner.observe(stats)
    return rows


def summarise(rows: list[dict], tail: int) -> dict:
    def rate(rs):
        return sum(r["n_bases"] for r in rs) / sum(r["wall_s"] for r in rs)

    last = rows[-tail:]
    cpu, gpu = sum(r["t_cpu"] for r in last), sum(r["t_gpu"] for r in last)
    return {"batches": len(rows), "bases": sum(r["n_bases"] for r in rows), "seconds": sum(r["wall_s"] for r in rows),
            "mbases_per_s": rate(rows) / 1e6, "tail_mbases_per_s": rate(last) / 1e6,
            "tail_factor": (cpu - gpu) / (cpu + gpu) if cpu + gpu else 0.0,
            "tail_max_batch_factor": max(abs(r["t_cpu"] - r["t_gpu"]) / (r["t_cpu"] + r["t_gpu"]) for r in last),
            "final": {k: last[-1][k] for k in dataclasses.asdict(GOOD)}}  # fmt: skip


def main() -> int:
    ap = shared_data_parser(__doc__, "bench-work/autotune")
    ap.add_argument("--bad-k", type=int, default=32, help="-K of the bad start [%(default)s]")
    ap.add_argument("--bad-max-lf", type=float, help="max-lf of the bad start [the profile's]")
    ap.add_argument("--bad-batches", type=int, default=30, help="batches of the untuned bad start [%(default)s]")
    ap.add_argument("--tuned-batches", type=int, default=80, help="batches of the tuned run [%(default)s]")
    ap.add_argument("--good-batches", type=int, default=20, help="batches of the hand-picked run [%(default)s]")
    ap.add_argument("--tail", type=int, default=15, help="batches at the end reported apart [%(default)s]")
    ap.add_argument("--call-copies", type=int, default=0, help="end-to-end runs on this many copies (0: none)")
    ap.add_argument("--call-runs", default="bad,tuned,good", help="end-to-end runs to make [%(default)s]")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds after which the end-to-end runs are skipped")
    args = ap.parse_args()
    t_start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    model = load_default_models()[0]
    plan = prepare({"max_reads": args.bad_k, "max_lf": args.bad_max_lf}, "auto")  # the rest from the profile
    bad = plan.settings
    res: dict = {"profile": plan.profile.name, "bad": dataclasses.asdict(bad), "good": dataclasses.asdict(GOOD),
                 "bounds": dataclasses.asdict(plan.bounds)}  # fmt: skip
    base = scaled_batch(args.data, args.work, model)
    res["base_reads"], res["base_bases"] = len(base[1]) - 1, int(base[1][-1])
    aligner = CudaAbea(CudaOptions(mem_frac=plan.mem_frac))
    a = aligner.arena
    res["device"], res["arena"] = aligner.device_name, {"bytes": a.n_bytes, "bases": a.bases, "events": a.events}
    run_stream(aligner, model, base, bad, 2)  # compiles the kernels
    res["stage"] = {}
    rows: dict[str, list] = {}
    rows["bad"] = run_stream(aligner, model, base, bad, args.bad_batches)
    tuner = AutoTuner(Controller(bad, plan.bounds, Policy(settle_batches=1)),
                      lambda s: aligner.retune(with_settings(aligner.options, s)))  # fmt: skip
    rows["tuned"] = run_stream(aligner, model, base, bad, args.tuned_batches, tuner)
    res["changes"] = tuner.summary()["changes"]
    res["closed"] = tuner.summary()["closed"]
    res["retried_after_loss"] = retried_after_loss(res["changes"], 0.20)
    rows["good"] = run_stream(aligner, model, base, GOOD, args.good_batches)
    for name, rs in rows.items():
        res["stage"][name] = summarise(rs, min(args.tail, len(rs)))
        print(name, json.dumps(res["stage"][name]), flush=True)
    (args.out / "stage_batches.json").write_text(json.dumps(rows))
    (args.out / "results.json").write_text(json.dumps(res, indent=2))
    del aligner

    if args.call_copies and time.perf_counter() - t_start < args.budget:
        rep = args.work / f"x{args.call_copies}"
        if not (rep / "reads.bam.bai").exists():
            res["replicate"] = replicate(args.data, rep, args.call_copies)
        subprocess.run([*STREAMER, "index", "-d", str(rep / "fast5"), str(rep / "reads.fasta")],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        # the CpG HMM stays on the CPU: the runs differ only where the tuner acts
        common = ["-b", str(rep / "reads.bam"), "-g", str(args.work / "ref.fa"), "-r", str(rep / "reads.fasta"),
                  "-K", str(args.bad_k), "--cuda-max-lf", str(bad.max_lf), "--disable-cuda-hmm"]  # fmt: skip
        # compile (or load) every kernel the runs use before timing any of them
        timed_call(["-b", str(args.data / "reads.mg1655.sorted.bam"), "-g", str(args.work / "ref.fa"), "-r",
              str(args.data / "reads.fasta"), "--signal", str(args.data / "fast5_files"), "--disable-cuda-hmm",
              "-o", str(args.work / "call_warm-up.tsv")], args.out / "call_warm-up.log")  # fmt: skip
        shutil.rmtree(args.work / "state", ignore_errors=True)  # the tuned run learns from nothing
        res["call"] = {}
        good = ["-K", str(GOOD.max_reads), "-B", str(GOOD.max_bases)]  # replace the bad start's -K (the last one wins)
        for label, extra in (("bad", []), ("tuned", ["--autotune", "--state-dir", str(args.work / "state")]),
                             ("good", good)):  # fmt: skip
            if label not in args.call_runs.split(","):
                continue
            if time.perf_counter() - t_start > args.budget:
                break
            stats = args.work / f"call_{label}.json"
            wall = timed_call([*common, "-o", str(args.work / f"call_{label}.tsv"), "--stats-json", str(stats), *extra],
                        args.out / f"call_{label}.log")  # fmt: skip
            res["call"][label] = {"wall_s": wall, **json.loads(stats.read_text())}
            print(f"call {label}: {wall:.1f} s", flush=True)
        outputs = {(args.work / f"call_{label}.tsv").read_bytes() for label in res["call"]}
        res["call_identical"] = len(outputs) == 1
        (args.out / "results.json").write_text(json.dumps(res, indent=2))
    res["elapsed_s"] = time.perf_counter() - t_start
    (args.out / "results.json").write_text(json.dumps(res, indent=2))
    print(report(res))
    return 0


def retried_after_loss(changes: list[dict], loss: float) -> list[dict]:
    """Moves made again in the direction of an earlier move of the same knob that cost more than `loss`."""
    closed, out = set(), []
    for c in changes:
        if c["leaf"] == "revert":
            continue
        way = (c["knob"], c["new"] > c["old"])
        if way in closed:
            out.append(c)
        if c["effect"] is not None and c["effect"] < -loss:
            closed.add(way)
    return out


def report(res: dict) -> str:
    lines = [f"{res['device']}; profile {res['profile']}; {res['base_reads']} records ({res['base_bases']} bases) "
             "repeated", "", "| run | batches | Mbases | stage s | Mbases/s | last batches Mbases/s | last f |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, s in res["stage"].items():
        lines.append(f"| {name} | {s['batches']} | {s['bases'] / 1e6:.1f} | {s['seconds']:.2f} | "
                     f"{s['mbases_per_s']:.1f} | {s['tail_mbases_per_s']:.1f} | {s['tail_factor']:+.2f} |")  # fmt: skip
    lines += ["", "| batch | knob | old | new | leaf | effect |", "|---|---|---|---|---|---|"]
    for c in res["changes"]:
        effect = "" if c["effect"] is None else f"{c['effect']:+.0%}"
        lines.append(f"| {c['batch']} | {c['knob']} | {c['old']} | {c['new']} | {c['leaf']} | {effect} |")
    lines += [f"\nclosed directions: {[(c['knob'], c['way'] if 'way' in c else c['direction']) for c in res['closed']]}",
              f"moves retried in a direction that had cost over 20%: {len(res['retried_after_loss'])}"]
    if "call" in res:
        lines += ["", "| streamer call | wall s | Mbases |", "|---|---|---|"]
        for label, r in res["call"].items():
            lines.append(f"| {label} | {r['wall_s']:.1f} | {r['bases'] / 1e6:.2f} |")
        lines.append(f"\noutputs identical: {res.get('call_identical')}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
