"""R10.4.1 `streamer call` on the GPU against the CPU, on simulated reads with known methylation.

The reads and models are those of `r10_meth_vs_f5c.py` (`write_inputs`: E. coli stretches on both
strands, 9-mer nucleotide table, synthetic CpG 9-mer model as text). Three configurations run
after a warm-up run of each, alternating, --repeats times: `cpu` (--disable-cuda), `gpu` (ABEA and
the CpG HMM on the GPU) and `gpu-abea` (--disable-cuda-hmm: ABEA on the GPU, the HMM on the CPU
threads). For each: wall seconds, bases per wall second and per compute second (the stages' own
time), each stage's share (the HMM's in particular), the GPU's read and window counts, and whether
its TSV is byte for byte the CPU's. Exit status 1 when an output differs or the GPU did not run.

    python benchmarks/r10_gpu_vs_cpu.py --model ../shared/models/r10/dna_r10.4.1_400bps_9mer.npz \
        --genome tests/data/ecoli_k12_mg1655.fa.gz --work /tmp/r10gpu [--reads 200] [--threads 16]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]
from r10_meth_vs_f5c import run_once, write_inputs  # noqa: E402

CONFIGS = {"cpu": ["--disable-cuda"], "gpu": [], "gpu-abea": ["--disable-cuda-hmm"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path, help="the R10.4.1 9-mer nucleotide table (.npz or text)")
    p.add_argument("--genome", required=True, type=Path)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--reads", type=int, default=200)
    p.add_argument("--p-meth", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each configuration, after a warm-up run")
    p.add_argument("--batchsize", type=int, default=512, help="-K of streamer call [%(default)s]")
    args = p.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    bases = write_inputs(work, args.model, args.genome, args.reads, args.p_meth, args.seed)
    print(f"{args.reads} reads, {bases} bases, {args.threads} threads")
    os.environ["STREAMER_MODEL_CACHE_DIR"] = str(work / "model-cache")
    os.environ["PYTHONPATH"] = os.pathsep.join(str(ROOT / d) for d in ("", "plugins", "gpu"))
    common = [sys.executable, "-m", "streamer", "call", "-r", "reads.fasta", "-b", "reads.bam", "-g",
              str(args.genome.resolve()), "--signal", "sim.blow5", "--pore", "r10", "--kmer-model", "model.txt",
              "--meth-model", "cpg.model", "-t", str(args.threads), "-K", str(args.batchsize)]  # fmt: skip
    report: dict = {"reads": args.reads, "bases": bases, "threads": args.threads}
    walls: dict[str, list[float]] = {name: [] for name in CONFIGS}
    stats: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for round_ in range(args.repeats + 1):  # round 0 compiles and warms caches
        for name, flags in CONFIGS.items():
            if "error" in report.get(name, {}):
                continue
            out, js = work / f"{name}.tsv", work / f"{name}.stats.json"
            wall, _, error = run_once([*common, *flags, "--stats-json", str(js)], out, work)
            if error:
                report[name] = {"error": error}
                print(f"{name}: FAILED ({error})")
            elif round_:
                walls[name].append(wall)
                stats[name].append(json.loads(js.read_text()))
    ok = True
    for name in CONFIGS:
        if "error" in report.get(name, {}):
            ok = False
            continue
        stage = {k: statistics.median(s["stage_seconds"].get(k, 0.0) for s in stats[name])
                 for k in stats[name][0]["stage_seconds"]}  # fmt: skip
        wall = statistics.median(walls[name])
        identical = filecmp.cmp(work / "cpu.tsv", work / f"{name}.tsv", shallow=False)
        gpu = stats[name][-1]["gpu"]
        report[name] = {
            "wall_s": [round(w, 2) for w in walls[name]], "bases_per_s": round(bases / wall),
            "bases_per_compute_s": round(bases / sum(stage.values())), "startup_s": stats[name][-1]["startup_s"],
            "stage_s": {k: round(v, 3) for k, v in stage.items()},
            "stage_share": {k: round(v / sum(stage.values()), 3) for k, v in stage.items()},
            "calls": stats[name][-1]["calls"], "gpu": gpu, "tsv_identical_to_cpu": identical,
        }  # fmt: skip
        ok &= identical and (name == "cpu" or gpu.get("abea_reads_gpu", 0) > 0)
        ok &= name != "gpu" or gpu.get("hmm_windows_gpu", 0) > 0
        print(f"{name}: {json.dumps(report[name])}")
    (work / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
