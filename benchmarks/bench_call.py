"""Throughput of `streamer call` against nanopolish and f5c on the same replicated reads.

Replicates the shared E. coli reads (new read ids, same signal) until the run is long
enough, then times, in one session on one machine:
  streamer call -t T        cold (empty numba cache) and warm (cache filled)
  nanopolish call-methylation -t T   (Debian package), if installed
  f5c call-methylation -t T          (--f5c PATH), if given
and reports bases/s, reads/s, ratios against each reference tool, streamer's stage
shares, peak RSS (GNU time: the largest single process) and peak summed PSS (every process of the
run's tree, sampled every 50 ms: reader processes share pages with their parent, so summing
RSS would count them twice). Absolute times drift on shared machines; the ratios are the result.

    python benchmarks/bench_call.py --copies 10 -t 2 [--f5c /path/to/f5c]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py

from common import STREAMER, new_id, replicate_bam
from streamer.summary import tree_pss
from streamer.io.fastx import load_basecalls

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "ecoli_2kb_region"
REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "ecoli_k12_mg1655.fa.gz"


def replicate(src: Path, out: Path, copies: int) -> dict:
    """Write `copies` copies of every read with fresh read ids: FAST5s, FASTA, sorted BAM."""
    fast5_dir = out / "fast5"
    fast5_dir.mkdir(parents=True)
    seqs = load_basecalls(src / "reads.fasta")
    files = sorted((src / "fast5_files").glob("*.fast5"))
    with open(out / "reads.fasta", "w") as fa:
        for c in range(copies):
            for f in files:
                dst = fast5_dir / f"c{c}_{f.name}"
                shutil.copy(f, dst)
                os.chmod(dst, 0o644)
                with h5py.File(dst, "r+") as h:
                    for grp in h["Raw/Reads"].values():
                        rid = grp.attrs["read_id"].decode()
                        new = new_id(rid, c)
                        grp.attrs["read_id"] = new.encode()
                        if rid in seqs:
                            fa.write(f">{new}\n{seqs[rid]}\n")
    records = replicate_bam(src / "reads.mg1655.sorted.bam", out / "reads.bam", copies)
    bases = sum(len(seqs[r.query_name]) for r in records
                if not r.is_unmapped and r.mapping_quality >= 20 and not r.is_secondary and r.query_name in seqs)
    return {"copies": copies, "records": copies * len(records), "bases": copies * bases}


def timed(cmd: list[str], env: dict | None = None, log: Path | None = None) -> dict:
    """Run a command; wall time, peak RSS (GNU time) and peak summed PSS of its process tree, output to `log`."""
    full = ["/usr/bin/time", "-f", "MAXRSS_KB %M"] + cmd
    t0 = time.perf_counter()
    peak_pss = 0
    with open(log or os.devnull, "w") as err:
        proc = subprocess.Popen(full, env=env, stdout=subprocess.DEVNULL, stderr=err)
        while proc.poll() is None:
            peak_pss = max(peak_pss, tree_pss(proc.pid))
            time.sleep(0.05)
    wall = time.perf_counter() - t0
    text = log.read_text() if log else ""
    rss = next((int(l.split()[1]) for l in text.splitlines() if l.startswith("MAXRSS_KB")), 0)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}")
    return {"wall_s": wall, "peak_rss_mb": rss / 1024, "peak_pss_mb": peak_pss / 2**20}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=10, help="replicas of the 112 shared reads [%(default)s]")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--f5c", type=Path, help="an f5c binary to compare against")
    ap.add_argument("--work", type=Path, default=Path("bench-work"), help="scratch folder [%(default)s]")
    ap.add_argument("--skip-nanopolish", action="store_true")
    args = ap.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} not found: this benchmark needs ../shared")
    data = args.work / f"ecoli_x{args.copies}"
    if not (data / "reads.bam.bai").exists():
        shutil.rmtree(data, ignore_errors=True)
        info = replicate(SHARED, data, args.copies)
        (data / "info.json").write_text(json.dumps(info))
    info = json.loads((data / "info.json").read_text())
    ref = data / "ref.fa"
    if not ref.exists():
        import gzip

        ref.write_bytes(gzip.decompress(REFERENCE.read_bytes()))
    common = ["-r", str(data / "reads.fasta"), "-b", str(data / "reads.bam"), "-g", str(ref), "-t", str(args.threads)]
    results = {"info": info, "threads": args.threads, "machine_cores": os.cpu_count()}

    subprocess.run([*STREAMER, "index", "-d", str(data / "fast5"), str(data / "reads.fasta")],
                   check=True)
    cache = Path(tempfile.mkdtemp(prefix="numba-cache-"))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    for label in ("streamer_cold", "streamer_warm"):
        stats = args.work / f"{label}.stats.json"
        r = timed([*STREAMER, "call", *common, "-o", str(args.work / f"{label}.tsv"),
                   "--stats-json", str(stats)], env=env, log=args.work / f"{label}.log")
        r["stage_seconds"] = json.loads(stats.read_text())["stage_seconds"]
        results[label] = r
    shutil.rmtree(cache, ignore_errors=True)

    if not args.skip_nanopolish and shutil.which("nanopolish"):
        if not Path(str(data / "reads.fasta") + ".index.readdb").exists():
            subprocess.run(["nanopolish", "index", "-d", str(data / "fast5"), str(data / "reads.fasta")],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        results["nanopolish"] = timed(["nanopolish", "call-methylation", *common], log=args.work / "nanopolish.log")
    if args.f5c:
        if not Path(str(data / "reads.fasta") + ".index.readdb").exists():
            subprocess.run([str(args.f5c), "index", "-d", str(data / "fast5"), str(data / "reads.fasta")], check=True)
        results["f5c"] = timed([str(args.f5c), "call-methylation", *common, "--disable-cuda=yes"],
                               log=args.work / "f5c.log")

    bases = info["bases"]
    records = info["records"]
    lines = [f"{bases / 1e6:.2f} Mbases, {records} alignment records, -t {args.threads}, {os.cpu_count()} cores", "",
             "| run | wall s | Mbases/s | reads/s | peak RSS MB | peak summed PSS MB | streamer warm speed-up |",
             "|---|---|---|---|---|---|---|"]
    warm = results["streamer_warm"]["wall_s"]
    for label in ("streamer_cold", "streamer_warm", "nanopolish", "f5c"):
        if label in results:
            r = results[label]
            lines.append(f"| {label} | {r['wall_s']:.1f} | {bases / r['wall_s'] / 1e6:.3f} | {records / r['wall_s']:.1f} | "
                         f"{r['peak_rss_mb']:.0f} | {r['peak_pss_mb']:.0f} | {r['wall_s'] / warm:.2f}x |")
    stages = results["streamer_warm"]["stage_seconds"]
    total = sum(stages.values()) or 1.0
    lines += ["", "streamer warm, time by stage: " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in stages.items())]
    report = "\n".join(lines)
    print(report)
    (args.work / "results.json").write_text(json.dumps(results, indent=2))
    (args.work / "results.md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
