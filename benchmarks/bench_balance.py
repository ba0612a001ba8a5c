"""Pathological inputs on a GPU: does the monitor name the right leaf, and does autotuning balance CPU and GPU?

The shared reads go through events and scaling once (real signal, real events); inputs that
stress the GPU ABEA split are then built from them and streamed through `CudaAbea.align` as
`benchmarks/bench_autotune.py` streams them (batches cut by K and B, one arena, the tuner acting
between batches with one settling batch):

  long     one read in five is very long: consecutive records joined end to end until a length
           drawn from 30-90 kb is reached, each record's events rescaled into the first one's
           shift and scale, so the joined read is one consistent read (bases, events, scaling);
  overseg  one read in four over-segmented: every event of the read repeated three times
           (about 6 events per base, over max-epk 5);
  smallk   the reads as they are, from K 32 (the memory tree's S4).

Each input runs untuned from its start (advice only: the leaf the monitor names) and then
autotuned from the same start. Reported per input: the first advice, the batch from which
every timed batch has its CPU and GPU times within 30% of each other (|t_cpu - t_gpu| over
the larger), reversals per knob, and stage throughput (bases over the seconds in `align`).

    python benchmarks/bench_balance.py --data ../shared/data/ecoli_2kb_region --out bench-work/balance
"""

from __future__ import annotations

import dataclasses
import json
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
from bench_autotune import Stream  # noqa: E402
from common import shared_data_parser  # noqa: E402
from bench_gpu_abea import scaled_batch  # noqa: E402

WITHIN = 0.30  # CPU and GPU times "within 30% of each other": |t_cpu - t_gpu| / max(t_cpu, t_gpu)


def assemble(base, groups: list[list[int]], repeats: list[int]):
    """Reads made of base records: each group joined end to end (events rescaled to its first record)."""
    seq, seq_off, ev_mean, ev_off, status, shift, scale = base
    seqs, evs, st, sh, sc = [], [], [], [], []
    for group, rep in zip(groups, repeats):
        r0 = group[0]
        seqs.append(np.concatenate([seq[seq_off[r] : seq_off[r + 1]] for r in group]))
        ev = [(ev_mean[ev_off[r] : ev_off[r + 1]] - shift[r]) / scale[r] * scale[r0] + shift[r0] for r in group]
        evs.append(np.repeat(np.concatenate(ev).astype(np.float32), rep))
        st.append(status[r0])
        sh.append(shift[r0])
        sc.append(scale[r0])

    def offsets(parts):
        out = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([len(p) for p in parts], out=out[1:])
        return out

    return (np.concatenate(seqs), offsets(seqs), np.concatenate(evs), offsets(evs), np.array(st, np.int8),
            np.array(sh, np.float32), np.array(sc, np.float32))  # fmt: skip


def long_reads(base, n_reads: int, share: float = 0.2, lengths=(30_000, 90_000), seed: int = 1):
    """One read in 1/share a join of consecutive good records up to a length drawn from `lengths`."""
    rng = np.random.default_rng(seed)
    good = np.flatnonzero(base[4] == 0)
    rec_len = np.diff(base[1])
    groups, at = [], 0
    for _ in range(n_reads):
        if rng.random() < share:
            target, group, total = rng.uniform(*lengths), [], 0
            while total < target:
                r = int(good[at % len(good)])
                group.append(r)
                total += int(rec_len[r])
                at += 1
            groups.append(group)
        else:
            groups.append([int(good[at % len(good)])])
            at += 1
    return assemble(base, groups, [1] * len(groups))


def over_segmented(base, n_reads: int, share: float = 0.25, repeat: int = 3, seed: int = 2):
    """The records in turn, one in 1/share with every event repeated `repeat` times."""
    rng = np.random.default_rng(seed)
    good = np.flatnonzero(base[4] == 0)
    groups = [[int(good[i % len(good)])] for i in range(n_reads)]
    return assemble(base, groups, [repeat if rng.random() < share else 1 for _ in groups])


def run(aligner: CudaAbea, model, reads, start: Settings, bounds, batches: int, autotune: bool, budget: float):
    """Batches from `start`, tuned or advice only; one row per batch with the monitor's decision."""
    stream = Stream(reads)
    tuner = AutoTuner(Controller(start, bounds, Policy(autotune=autotune, settle_batches=1)),
                      lambda s: aligner.retune(with_settings(aligner.options, s)))  # fmt: skip
    aligner.retune(with_settings(aligner.options, start))
    rows, t_end = [], time.perf_counter() + budget
    for b in range(batches):
        s = tuner.settings
        arrays = stream.next(s)
        t0 = time.perf_counter()
        _, stats = aligner.align(AbeaReads(*arrays), model)
        wall = time.perf_counter() - t0
        actions = tuner.observe(stats)
        d = tuner.controller.decision
        rows.append({"batch": b + 1, "wall_s": wall, **dataclasses.asdict(s), **dataclasses.asdict(stats),
                     "memory": None if d.memory is None else str(d.memory),
                     "load": None if d.load is None else str(d.load), "guards": [str(g) for g in d.guards],
                     "advice": [str(a) for a in d.advice], "actions": [a.as_dict() for a in actions]})  # fmt: skip
        if time.perf_counter() > t_end:
            break
    return rows, tuner.summary()["changes"]


def gap(r: dict) -> float:
    hi = max(r["t_cpu"], r["t_gpu"])
    return abs(r["t_cpu"] - r["t_gpu"]) / hi if hi > 0 else 0.0


def summarise(rows: list[dict], changes: list[dict]) -> dict:
    """First advice, where CPU and GPU times stay within 30%, reversals per knob, throughput."""
    timed = [r for r in rows if not r["guards"]]
    first = next((r for r in rows if r["advice"]), None)
    balanced_from = None
    for r in reversed(timed):
        if gap(r) > WITHIN:
            break
        balanced_from = r["batch"]
    moves: dict[str, list[int]] = {}
    for c in changes:
        moves.setdefault(c["knob"], []).append(1 if c["new"] > c["old"] else -1)
    tail = rows[-10:]

    def rate(rs):
        return sum(r["n_bases"] for r in rs) / sum(r["wall_s"] for r in rs) / 1e6

    return {"batches": len(rows), "first_advice": None if first is None else (first["batch"], first["advice"]),
            "leaves": [r["load"] for r in rows], "balanced_from": balanced_from,
            "balanced_batches": sum(1 for r in timed if gap(r) <= WITHIN), "timed_batches": len(timed),
            "reversals": {k: sum(1 for a, b in zip(v, v[1:]) if a != b) for k, v in moves.items()},
            "mbases_per_s": rate(rows), "tail_mbases_per_s": rate(tail),
            "tail_cpu_s": sum(r["t_cpu"] for r in tail), "tail_gpu_s": sum(r["t_gpu"] for r in tail),
            "final": {k: rows[-1][k] for k in dataclasses.asdict(Settings())}}  # fmt: skip


def main() -> int:
    ap = shared_data_parser(__doc__, "bench-work/balance")
    ap.add_argument("--inputs", default="long,overseg,smallk", help="which inputs, comma-separated [%(default)s]")
    ap.add_argument("--reads", type=int, default=4000, help="reads of each built input (then repeated) [%(default)s]")
    ap.add_argument("--untuned", type=int, default=8, help="batches of each untuned run [%(default)s]")
    ap.add_argument("--tuned", type=int, default=60, help="batches of each tuned run [%(default)s]")
    ap.add_argument("--budget", type=float, default=120, help="seconds at most per run [%(default)s]")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    model = load_default_models()[0]
    plan = prepare({}, "auto")
    base = scaled_batch(args.data, args.work, model)
    aligner = CudaAbea(CudaOptions(mem_frac=plan.mem_frac))
    starts = {"long": plan.settings, "overseg": plan.settings, "smallk": dataclasses.replace(plan.settings, max_reads=32)}
    builders = {"long": lambda: long_reads(base, args.reads), "overseg": lambda: over_segmented(base, args.reads),
                "smallk": lambda: base}  # fmt: skip
    res: dict = {"device": aligner.device_name, "profile": plan.profile.name, "bounds": dataclasses.asdict(plan.bounds),
                 "arena": {"bytes": aligner.arena.n_bytes, "bases": aligner.arena.bases}, "inputs": {}}  # fmt: skip
    aligner.align(AbeaReads(*Stream(base).next(Settings(max_reads=64))), model)  # compiles the kernels
    for name in args.inputs.split(","):
        reads = builders[name]()
        lengths = np.diff(reads[1])
        info = {"start": dataclasses.asdict(starts[name]), "reads": len(lengths), "bases": int(lengths.sum()),
                "mean_len": float(lengths.mean()), "max_len": int(lengths.max()),
                "events_per_base": float(np.diff(reads[3]).sum() / lengths.sum())}  # fmt: skip
        for label, autotune, n in (("untuned", False, args.untuned), ("tuned", True, args.tuned)):
            rows, changes = run(aligner, model, reads, starts[name], plan.bounds, n, autotune, args.budget)
            info[label] = summarise(rows, changes)
            info[label]["changes"] = changes
            (args.out / f"{name}_{label}_batches.json").write_text(json.dumps(rows))
            print(name, label, json.dumps({k: v for k, v in info[label].items() if k not in ("leaves", "changes")}),
                  flush=True)  # fmt: skip
        res["inputs"][name] = info
        (args.out / "results.json").write_text(json.dumps(res, indent=2))
    print(report(res))
    return 0


def report(res: dict) -> str:
    lines = [f"{res['device']}; profile {res['profile']}", "",
             "| input | run | batches | first advice | CPU/GPU within 30% from batch | within 30% | reversals | "
             "Mbases/s | last 10 Mbases/s | last 10 cpu s / gpu s |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, info in res["inputs"].items():
        for label in ("untuned", "tuned"):
            s = info[label]
            adv = "-" if s["first_advice"] is None else f"{'/'.join(s['first_advice'][1])} (batch {s['first_advice'][0]})"
            lines.append(f"| {name} | {label} | {s['batches']} | {adv} | {s['balanced_from']} | "
                         f"{s['balanced_batches']}/{s['timed_batches']} | {s['reversals']} | {s['mbases_per_s']:.1f} | "
                         f"{s['tail_mbases_per_s']:.1f} | {s['tail_cpu_s']:.2f} / {s['tail_gpu_s']:.2f} |")  # fmt: skip
    for name, info in res["inputs"].items():
        lines += ["", f"{name}: changes", "", "| batch | knob | old | new | leaf | effect |", "|---|---|---|---|---|---|"]
        for c in info["tuned"]["changes"]:
            effect = "" if c["effect"] is None else f"{c['effect']:+.0%}"
            lines.append(f"| {c['batch']} | {c['knob']} | {c['old']} | {c['new']} | {c['leaf']} | {effect} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
