"""Loading a 1,953,125-row CpG 9-mer text model: cold (parse and build the cache) and warm (cache hit).

Writes the synthetic CpG 9-mer model (`tests/r10_sim.py`, from the R10.4.1 9-mer table) as text,
then in fresh Python processes, each as a start of `streamer` would: imports streamer's model
module, loads the file, and reports the seconds `load_model` took and the process's peak RSS.
Cold runs start from an empty cache folder; warm runs find the cache the cold run built. The
numba kernels are compiled (cached) before the first timed run.

    python benchmarks/bench_model_load.py --model ../shared/models/r10/dna_r10.4.1_400bps_9mer.npz \
        --work /tmp/modelload [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
from r10_sim import synthetic_cpg_model, write_text_model  # noqa: E402

from streamer.pore.model import load_model  # noqa: E402

# VmHWM, not ru_maxrss: Linux folds the forking parent's peak into ru_maxrss across exec
PEAK = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) / 1024"
CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
from streamer.pore.model import load_model
t1 = time.perf_counter()
m = load_model(sys.argv[1])
t2 = time.perf_counter()
assert m.n_kmers == 5 ** 9 and m.alphabet == "ACGMT"
print(json.dumps({{"import_s": t1 - t0, "load_s": t2 - t1, "peak_rss_mb": {peak}}}))
"""


def child(model: Path, cache: Path) -> dict:
    env = {**os.environ, "STREAMER_MODEL_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), peak=PEAK), str(model)], env=env, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return json.loads(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path, help="the R10.4.1 9-mer nucleotide table")
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    text = args.work / "cpg9.model"
    write_text_model(synthetic_cpg_model(load_model(args.model)), text)
    print(f"{text}: {text.stat().st_size / 1e6:.1f} MB, {5**9} rows")
    cache = args.work / "cache"
    child(text, cache)  # compiles the parsing kernels into numba's cache
    runs: dict[str, list[dict]] = {"cold": [], "warm": []}
    for _ in range(args.repeats):
        shutil.rmtree(cache, ignore_errors=True)
        runs["cold"].append(child(text, cache))
        runs["warm"].append(child(text, cache))
    baseline = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
                               f"import streamer.pore.model; print({PEAK})"], check=True, capture_output=True,
                              text=True).stdout  # fmt: skip
    report = {"rows": 5**9, "bytes": text.stat().st_size, "cpus": os.cpu_count(),
              "import_only_peak_rss_mb": round(float(baseline), 1)}  # fmt: skip
    for kind, rs in runs.items():
        report[kind] = {key: round(statistics.median(r[key] for r in rs), 3) for key in rs[0]}
        report[kind]["load_s_all"] = [round(r["load_s"], 3) for r in rs]
    print(json.dumps(report, indent=2))
    return 0 if report["warm"]["load_s"] < 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
