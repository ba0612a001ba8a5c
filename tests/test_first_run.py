"""The first run on a machine: an empty numba cache is announced at once, and the compile is
start-up, kept out of the stage times and the throughput."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

from streamer import config
from streamer.commands.run import _pore_pipeline
from streamer.pipeline import warmup
from streamer.pipeline.warmup import FIRST_COMPILE_S
from streamer_plugins.outputs.sinks import CallRows

DATA = Path(__file__).parent / "data"
README = Path(__file__).resolve().parents[1] / "README.md"
ECOLI = DATA / "ecoli"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _call(tmp_path: Path, cache: Path, name: str):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    env.pop("STREAMER_DEBUG", None)
    stats = tmp_path / f"{name}.json"
    argv = [sys.executable, "-m", "streamer", "call", "-r", str(ECOLI / "reads.fasta"), "-b", str(ECOLI / "reads.bam"),
            "-g", str(DATA / "ecoli_k12_mg1655.fa.gz"), "--signal", str(ECOLI / "fast5"), "-o", str(tmp_path / f"{name}.tsv"),
            "--stats-json", str(stats), "-t", "2", "--io-mode", "threads"]
    started = time.monotonic()
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    first = proc.stderr.readline()
    seen = time.monotonic() - started, _cpu_seconds(proc.pid)
    rest = proc.stderr.read()
    assert proc.wait() == 0, first + rest
    return first, seen, first + rest, json.loads(stats.read_text())


def test_the_first_run_says_it_compiles_and_its_speed_excludes_the_compile(tmp_path):
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    first, (wall, cpu), err, stats = _call(tmp_path, cache, "cold")
    assert first.startswith("compiling kernels for this machine (first run only, about ")
    # announced before any kernel is compiled: the interpreter and imports only (about 1.5 s of wall
    # time on an idle machine; CPU time, which a busy machine does not stretch, is what is held here)
    assert cpu < 2.0, (wall, cpu)
    assert stats["compiled_kernels"] and "compiling kernels for this machine: first run only" in err
    working = stats["elapsed_s"] - stats["startup_s"]
    assert sum(stats["stage_seconds"].values()) < stats["startup_s"]  # the compile is not in a stage
    assert abs(stats["bases_per_s"] - stats["bases"] / working) <= 0.01 * stats["bases_per_s"] + 1

    first, _, err, warm = _call(tmp_path, cache, "warm")  # the cache is filled: nothing to announce
    assert "compiling kernels" not in err and not warm["compiled_kernels"]
    assert (tmp_path / "cold.tsv").read_text() == (tmp_path / "warm.tsv").read_text()


def test_the_daemons_pipeline_compiles_the_calls_tsv_kernel_before_the_first_batch(monkeypatch):
    """A daemon's first batch on a new machine waited seconds on the TSV formatter's compile: its
    pipeline is now built with the warm-up read's calls rendered, as `streamer call` does."""
    rendered = []
    render = CallRows.render
    monkeypatch.setattr(CallRows, "render", lambda self, result: rendered.append(render(self, result)) or rendered[-1])
    _pore_pipeline(config.Config())
    (text,) = rendered
    assert text.count("\n") > 0 and all(len(row.split("\t")) == 11 for row in text.splitlines())


def test_the_compile_time_is_told_as_measured_wherever_it_is_told():
    readme = " ".join(README.read_text().split())
    told = re.findall(r"compiles the kernels[^.]*?about ([^;,)]+)", readme)
    assert len(told) == 4 and set(told) == {f"{FIRST_COMPILE_S} s on 2 cores"}, told


KERNEL = '''
import numba
import numpy as np

@numba.njit(cache=True, nogil=True)
def total(a):
    out = np.empty(1, np.float64)  # an allocation: numba's runtime must be linked
    out[0] = a.sum()
    return out
'''

LOAD = '''
import sys
import numba
import numpy as np
from streamer.pipeline import warmup

warmup.load_without_registries()
import kernel

assert kernel.total(np.arange(5.0))[0] == 10.0
assert sum(kernel.total.stats.cache_hits.values()) == int(sys.argv[1])
print("registries" if "numba.misc.gdb_hook" in sys.modules else "lean")

@numba.njit
def joined(s):  # a compile after the lean load refreshes the registries itself
    return len(s + "ab")

assert joined("xyz") == 5
'''


def test_a_cached_kernel_loads_without_the_compilers_registries_and_a_compile_after_it_works(tmp_path):
    (tmp_path / "kernel.py").write_text(KERNEL)
    (tmp_path / "load.py").write_text(LOAD)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}

    def load(hits: int) -> str:
        run = subprocess.run([sys.executable, str(tmp_path / "load.py"), str(hits)], env=env, capture_output=True,
                             text=True)  # fmt: skip
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    assert load(0) == "registries"  # compiled: the compiler loaded them
    assert load(1) == "lean"  # loaded from the cache: nothing imported for it


class _Context:
    """A target context as numba's cache sees it: `refresh` loads the registries (counted here)."""

    def __init__(self):
        self.refreshed = 0

    def refresh(self):
        self.refreshed += 1


class _GpuCache:
    """numba-cuda's own cache, as its `load_overload` goes: the context refreshed, then the kernel loaded."""

    def load_overload(self, sig, target_context):
        target_context.refresh()
        return "kernel"


def test_the_gpu_packages_kernels_load_lean_only_where_the_command_asked_for_it(monkeypatch):
    from numba.core import caching

    module = types.ModuleType("numba.cuda.core.caching")
    module.Cache = _GpuCache
    package = types.ModuleType("numba.cuda.core")
    package.caching = module
    monkeypatch.setitem(sys.modules, "numba.cuda.core", package)
    monkeypatch.setitem(sys.modules, "numba.cuda.core.caching", module)
    # numba's own load, as before a command asked (a `streamer call` run in this process asks for good); put back after
    monkeypatch.setattr(caching.Cache, "load_overload", inspect.unwrap(caching.Cache.load_overload))
    monkeypatch.setattr(_GpuCache, "load_overload", _GpuCache.load_overload)

    warmup.gpu_kernels_too()  # no command asked: the GPU's cache is left as numba-cuda has it
    context = _Context()
    assert _GpuCache().load_overload(None, context) == "kernel" and context.refreshed == 1

    warmup.load_without_registries()
    warmup.gpu_kernels_too()
    context = _Context()
    assert _GpuCache().load_overload(None, context) == "kernel" and context.refreshed == 0
    assert "refresh" not in vars(context)  # its own refresh back once the kernel is loaded
    context.refresh()
    assert context.refreshed == 1
