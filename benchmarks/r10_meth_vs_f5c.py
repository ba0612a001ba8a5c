"""R10.4.1 CpG methylation against f5c 1.6 on simulated reads with known methylation.

Writes N reads of random E. coli stretches (alternating strands; random dwell shape, shift and
scale) whose CpGs are each methylated with probability --p-meth, their signal drawn from the
9-mer nucleotide table for unmethylated k-mers and from a synthetic CpG 9-mer model for k-mers
holding a methylated C (`tests/r10_sim.py`); the truth per site goes to `truth.tsv`. Both models
are written as the text both tools read (`model.txt`, 4^9 rows; `cpg.model`, 5^9 rows). Then it
runs `f5c call-methylation --pore r10` and `streamer call` on 2 threads (a warm-up run of each,
then --repeats rounds, the tools alternating so that a shared machine's load swings hit both)
and reports, for the rows (read, chromosome, strand, start, end) each writes, how they
coincide, the share of LLRs within 0.01 and the largest difference, per-site accuracy and AUC
against the truth, bases per wall second and per CPU second (medians), and streamer's start-up
and stage shares. A tool that fails is reported and the other still scored.

    python benchmarks/r10_meth_vs_f5c.py --f5c PATH/f5c --model ../shared/models/r10/dna_r10.4.1_400bps_9mer.npz \
        --genome ecoli.fa --work /tmp/r10meth [--reads 48] [--p-meth 0.5]

`--genome` must be a plain FASTA with a `.fai` (f5c reads it through faidx).
"""

from __future__ import annotations

import argparse
import csv
import filecmp
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "plugins"), str(ROOT / "gpu")]
from r10_sim import Placed, simulate_methylated, synthetic_cpg_model, write_run, write_text_model  # noqa: E402

from streamer.io.reference import Reference  # noqa: E402
from streamer.pore.model import load_model  # noqa: E402

CALLED = 2.5  # |LLR| at which meth-freq counts a site as called


def write_inputs(work: Path, model_path: Path, genome: Path, n_reads: int, p_meth: float, seed: int) -> int:
    """The run's files, both models as text and truth.tsv; returns the bases simulated."""
    kmer = load_model(model_path)
    meth = synthetic_cpg_model(kmer)
    rng = np.random.default_rng(seed)
    reads, truth = [], []
    with Reference(genome) as ref:
        contig = ref.names[0]
        length = ref.length(contig)
        while len(reads) < n_reads:
            n = int(rng.integers(1000, 6000))
            start, rc = int(rng.integers(0, length - n)), len(reads) % 2 == 1
            stretch = ref.fetch(contig, start, start + n)
            if set(stretch) - set("ACGT"):
                continue
            sim = simulate_methylated(kmer, meth, stretch, rc, p_meth, rng, shift=float(rng.normal(0, 8)),
                                      scale=float(rng.uniform(0.9, 1.15)), dwell_shape=float(rng.uniform(1.2, 4.0)))
            reads.append(Placed(sim.read, start, rc, stretch))
            rid = sim.read.record.read_id
            truth += [(rid, contig, start + int(s), int(m)) for s, m in zip(sim.sites, sim.methylated)]
    write_run(work, reads, contig, length)
    write_text_model(kmer, work / "model.txt")
    write_text_model(meth, work / "cpg.model")
    with open(work / "truth.tsv", "w") as fh:
        fh.write("read_name\tchromosome\tposition\tmethylated\n")
        fh.writelines(f"{r}\t{c}\t{p}\t{m}\n" for r, c, p, m in truth)
    return sum(len(r.stretch) for r in reads)


def run_once(cmd: list[str], out: Path, cwd: Path) -> tuple[float, float, str]:
    """Wall and CPU (user + system) seconds of one run, and its last stderr line when it failed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(out, "w") as fh:
        proc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    lines = proc.stderr.strip().splitlines()
    return wall, cpu, "" if proc.returncode == 0 else f"exit {proc.returncode}: {lines[-1] if lines else ''}"


def read_calls(path: Path) -> dict[tuple, dict]:
    """Rows keyed by (read, chromosome, strand, start, end)."""
    with open(path) as fh:
        return {(r["read_name"], r["chromosome"], r["strand"], int(r["start"]), int(r["end"])): r
                for r in csv.DictReader(fh, delimiter="\t")}  # fmt: skip


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half)."""
    pos, neg = scores[labels], scores[~labels]
    if not len(pos) or not len(neg):
        return float("nan")
    values, inverse, counts = np.unique(np.concatenate([pos, neg]), return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = ((ends - counts + 1 + ends) / 2)[inverse]  # 1-based, ties share their average rank
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def score(calls: dict[tuple, dict], truth: dict[tuple, bool]) -> dict:
    """Per-site accuracy (LLR > 0 read as methylated) and AUC: each CpG a group call spans gets the
    group's LLR (as meth-freq -s counts it). Groups whose sites were simulated differently cannot
    be right for all of them, so single-CpG calls and groups of one truth are also scored apart."""
    llr, label, single, uniform, minus = [], [], [], [], []
    for (read, chrom, strand, start, end), row in calls.items():
        sites = [p for p in range(start, end + 1) if (read, chrom, p) in truth]
        labels = [truth[(read, chrom, p)] for p in sites]
        llr += [float(row["log_lik_ratio"])] * len(sites)
        label += labels
        single += [int(row["num_motifs"]) == 1] * len(sites)
        uniform += [len(set(labels)) == 1] * len(sites)
        minus += [strand == "-"] * len(sites)
    llr, label, single, uniform, minus = (np.array(x) for x in (llr, label, single, uniform, minus))
    label = label.astype(bool)
    called = np.abs(llr) >= CALLED
    right = (llr > 0) == label
    return {
        "sites_scored": int(len(llr)), "sites_in_truth": len(truth),
        "accuracy": float(right.mean()), "auc": auc(llr, label),
        "called_share": float(called.mean()), "accuracy_called": float(right[called].mean()),
        "accuracy_single_cpg": float(right[single].mean()), "auc_single_cpg": auc(llr[single], label[single]),
        "auc_single_cpg_plus": auc(llr[single & ~minus], label[single & ~minus]),
        "auc_single_cpg_minus": auc(llr[single & minus], label[single & minus]),
        "accuracy_uniform_groups": float(right[uniform].mean()),
        "auc_uniform_groups": auc(llr[uniform], label[uniform]),
    }  # fmt: skip


def compare(theirs: dict[tuple, dict], ours: dict[tuple, dict]) -> dict:
    both = sorted(set(theirs) & set(ours))
    diff = np.array([abs(float(theirs[k]["log_lik_ratio"]) - float(ours[k]["log_lik_ratio"])) for k in both])
    return {
        "rows_f5c": len(theirs), "rows_streamer": len(ours), "rows_identical": set(theirs) == set(ours),
        "only_f5c": len(set(theirs) - set(ours)), "only_streamer": len(set(ours) - set(theirs)),
        "llr_within_0.01": float((diff <= 0.01).mean()) if len(diff) else float("nan"),
        "llr_max_diff": float(diff.max()) if len(diff) else float("nan"),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--f5c", required=True, type=Path)
    p.add_argument("--model", required=True, type=Path, help="the R10.4.1 9-mer nucleotide table (.npz or text)")
    p.add_argument("--genome", required=True, type=Path)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--reads", type=int, default=48)
    p.add_argument("--p-meth", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each tool, after a warm-up run")
    p.add_argument("--streamer-args", default="--disable-cuda", help="extra flags for streamer call [%(default)s]")
    args = p.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    bases = write_inputs(work, args.model, args.genome, args.reads, args.p_meth, args.seed)
    print(f"{args.reads} reads, {bases} bases, p_meth {args.p_meth}")
    genome, t = str(args.genome.resolve()), str(args.threads)
    common = ["-r", "reads.fasta", "-b", "reads.bam", "-g", genome, "-t", t, "--kmer-model", "model.txt",
              "--meth-model", "cpg.model"]  # fmt: skip
    subprocess.run([str(args.f5c.resolve()), "index", "--slow5", "sim.blow5", "reads.fasta"], cwd=work, check=True,
                   capture_output=True)  # fmt: skip
    os.environ["STREAMER_MODEL_CACHE_DIR"] = str(work / "model-cache")  # not the user's cache
    # this checkout's streamer, whichever is installed
    os.environ["PYTHONPATH"] = os.pathsep.join(str(ROOT / d) for d in ("", "plugins", "gpu"))
    runs = {
        "f5c": [str(args.f5c.resolve()), "call-methylation", *common, "--slow5", "sim.blow5", "--pore", "r10"],
        "streamer": [sys.executable, "-m", "streamer", "call", *common, "--signal", "sim.blow5", "--pore", "r10",
                     "--stats-json", "stats.json", *args.streamer_args.split()],
    }  # fmt: skip
    with open(work / "truth.tsv") as fh:
        truth = {(r["read_name"], r["chromosome"], int(r["position"])): r["methylated"] == "1"
                 for r in csv.DictReader(fh, delimiter="\t")}  # fmt: skip
    report: dict = {"reads": args.reads, "bases": bases, "p_meth": args.p_meth, "threads": args.threads}
    calls = {}
    times: dict[str, list[tuple[float, float]]] = {tool: [] for tool in runs}
    for round_ in range(args.repeats + 1):  # round 0 warms caches; tools alternate, so load swings hit both
        for tool, cmd in runs.items():
            if tool in report:
                continue
            wall, cpu, error = run_once(cmd, work / f"{tool}.tsv", work)
            if error:
                report[tool] = {"error": error}
                print(f"{tool}: FAILED ({error})")
            elif round_:
                times[tool].append((wall, cpu))
    for tool in runs:
        if tool in report:
            continue
        calls[tool] = read_calls(work / f"{tool}.tsv")
        wall, cpu = (statistics.median(x) for x in zip(*times[tool]))
        report[tool] = {"wall_s": [round(w, 2) for w, _ in times[tool]], "cpu_s": [round(c, 2) for _, c in times[tool]],
                        "bases_per_s": round(bases / wall), "bases_per_cpu_s": round(bases / cpu),
                        **score(calls[tool], truth)}  # fmt: skip
        print(f"{tool}: {json.dumps(report[tool])}")
    if "error" not in report["streamer"]:  # the last run's own account: start-up and stage times
        stats = json.loads((work / "stats.json").read_text())
        stages = stats["stage_seconds"]
        report["streamer"]["startup_s"] = stats["startup_s"]
        report["streamer"]["stage_share"] = {k: round(v / sum(stages.values()), 3) for k, v in stages.items()}
        print(f"streamer stages: startup {stats['startup_s']} s, {report['streamer']['stage_share']}")
    if len(calls) == 2:
        report["parity"] = compare(calls["f5c"], calls["streamer"])
        report["parity"]["tsv_byte_identical"] = filecmp.cmp(work / "f5c.tsv", work / "streamer.tsv", shallow=False)
        print(f"parity: {json.dumps(report['parity'])}")
    (work / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0 if "parity" in report and report["parity"]["rows_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
