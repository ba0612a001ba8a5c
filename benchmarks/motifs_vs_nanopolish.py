"""GpC, dam and dcm calls against nanopolish 0.14 on the shared E. coli reads (issue 28, done-when 2 and 3).

Copies the reads and their single-read FAST5 files to --work, decompresses the reference there, runs
`nanopolish index` once, then for each motif `nanopolish call-methylation -q MOTIF` and `streamer call
-q MOTIF` (both on -t threads, timed), and reports: the rows (read, strand, start) each writes and how
they coincide, the share of log-likelihood ratios identical as printed and the largest difference,
whether the whole TSV is byte-identical; `streamer meth-freq --compat nanopolish` of streamer's calls
against nanopolish's calculate_methylation_frequency.py of nanopolish's (--script: that script from
nanopolish's source, kept outside this repository); and, side by side, the share of confident calls
(|LLR| >= 2.5) that are methylated, per call and per site, with CpG beside them (f5c's arithmetic).

    python benchmarks/motifs_vs_nanopolish.py --data ../shared/data/ecoli_2kb_region \\
        --genome ../shared/data/reference/ecoli_k12_mg1655.fa.gz --script /tmp/calculate_methylation_frequency.py \\
        --work /tmp/motifs [-t 2]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import shutil
import subprocess
import sys
import time
from pathlib import Path

CONFIDENT = 2.5  # |LLR| of a call meth-freq counts (f5c's)
MOTIFS = ("gpc", "dam", "dcm", "cpg")


def run(cmd: list[str], out: Path, cwd: Path) -> float:
    """Wall seconds of `cmd`, its stdout into `out` and its stderr beside it."""
    t0 = time.perf_counter()
    with open(out, "w") as fh, open(out.with_suffix(".log"), "w") as err:
        subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=err, check=True)
    return time.perf_counter() - t0


def calls(path: Path) -> dict[tuple, dict]:
    with open(path) as fh:
        return {(r["read_name"], r["strand"], int(r["start"])): r for r in csv.DictReader(fh, delimiter="\t")}


def methylated_share(rows: dict[tuple, dict]) -> tuple[int, float, float]:
    """Confident calls, and the share of them methylated per call and per site (a call of n sites counts n)."""
    confident = [r for r in rows.values() if abs(float(r["log_lik_ratio"])) >= CONFIDENT]
    methylated = [r for r in confident if float(r["log_lik_ratio"]) > 0]
    sites = sum(int(r["num_motifs"]) for r in confident)
    return len(confident), len(methylated) / len(confident), sum(int(r["num_motifs"]) for r in methylated) / sites


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the shared ecoli_2kb_region folder")
    ap.add_argument("--genome", type=Path, required=True, help="the reference, FASTA or gzip FASTA")
    ap.add_argument("--script", type=Path, help="nanopolish's scripts/calculate_methylation_frequency.py")
    ap.add_argument("--work", type=Path, default=Path("/tmp/motifs"), help="scratch folder [%(default)s]")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()
    work = a.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shutil.copytree(a.data / "fast5_files", work / "fast5_files")
    shutil.copy(a.data / "reads.fasta", work / "reads.fasta")
    genome = work / "ref.fa"
    opener = gzip.open if a.genome.suffix == ".gz" else open
    with opener(a.genome, "rb") as src, open(genome, "wb") as dst:
        shutil.copyfileobj(src, dst)
    bam = (a.data / "reads.mg1655.sorted.bam").resolve()
    run(["nanopolish", "index", "-d", "fast5_files", "reads.fasta"], work / "index.out", work)
    streamer = [sys.executable, "-m", "streamer"]
    common = ["-r", "reads.fasta", "-b", str(bam), "-g", str(genome), "-t", str(a.threads)]
    run([*streamer, "call", *common, "--signal", "fast5_files", "-o", "/dev/null"], work / "warm-up.out", work)

    print("| motif | rows (nanopolish / streamer / both) | LLR identical as printed | largest difference | "
          "TSV byte-identical | meth-freq identical to the script | nanopolish s | streamer s |")
    print("|---|---|---|---|---|---|---|---|")
    shares = []
    for motif in MOTIFS:
        theirs, ours = work / f"nanopolish.{motif}.tsv", work / f"streamer.{motif}.tsv"
        t_np = run(["nanopolish", "call-methylation", "-q", motif, *common], theirs, work)
        t_st = run([*streamer, "call", *common, "--signal", "fast5_files", "-q", motif, "-o", str(ours)],
                   work / f"streamer.{motif}.out", work)  # fmt: skip
        a_rows, b_rows = calls(ours), calls(theirs)
        both = set(a_rows) & set(b_rows)
        same = sum(a_rows[k]["log_lik_ratio"] == b_rows[k]["log_lik_ratio"] for k in both)
        largest = max(abs(float(a_rows[k]["log_lik_ratio"]) - float(b_rows[k]["log_lik_ratio"])) for k in both)
        identical = ours.read_bytes() == theirs.read_bytes()
        freq = "not run (no --script)"
        if a.script is not None:
            script, mine = work / f"freq.nanopolish.{motif}.tsv", work / f"freq.streamer.{motif}.tsv"
            run([sys.executable, str(a.script), str(theirs)], script, work)
            run([*streamer, "meth-freq", "--compat", "nanopolish", "-q", motif, str(ours)], mine, work)
            text = script.read_text()
            freq = f"{'yes' if text == mine.read_text() else 'NO'} ({text.count(chr(10)) - 1:,} sites)"
        print(f"| {motif} | {len(b_rows):,} / {len(a_rows):,} / {len(both):,} | {same:,} ({100 * same / len(both):.3f}%) "
              f"| {largest:.2f} | {'yes' if identical else 'no'} | {freq} | {t_np:.1f} | {t_st:.1f} |")
        shares.append((motif, methylated_share(b_rows), methylated_share(a_rows)))

    print()
    print(f"| motif | confident calls (\\|LLR\\| >= {CONFIDENT}) | methylated, per call: nanopolish / streamer | "
          "per site: nanopolish / streamer |")
    print("|---|---|---|---|")
    for motif, (n_np, call_np, site_np), (n_st, call_st, site_st) in shares:
        print(f"| {motif} | {n_np:,} / {n_st:,} | {100 * call_np:.1f}% / {100 * call_st:.1f}% | "
              f"{100 * site_np:.1f}% / {100 * site_st:.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
