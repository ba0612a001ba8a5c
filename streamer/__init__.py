"""streamer: real-time nanopore signal analysis (events, ABEA, CpG methylation)."""

from __future__ import annotations

import ctypes
import importlib.abc
import os
import site
import sys
import tempfile
import time
from pathlib import Path

__version__ = "0.1.0"
IMPORTED = time.perf_counter()  # where a command's trace begins (`--trace`): its imports come after


def numba_cache_dir(package: Path, env: dict[str, str]) -> Path | None:
    """Where numba should cache compiled kernels, or None where its own choice works.

    numba caches beside the package, or else in the user's cache folder; where neither can be
    written (a service user with no home, a read-only install) every import of a cached kernel
    fails. Then: streamer's folder in the user's cache, or else one in the temporary folder.
    """
    if env.get("NUMBA_CACHE_DIR") or os.access(package, os.W_OK):
        return None
    home = env.get("HOME")
    base = env.get("XDG_CACHE_HOME") or (str(Path(home) / ".cache") if home else "")
    candidates = [Path(base) / "streamer" / "numba"] if base else []
    candidates.append(Path(tempfile.gettempdir()) / f"streamer-numba-{os.getuid()}")
    for folder in candidates:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    return None


CACHE_DIR = numba_cache_dir(Path(__file__).parent, dict(os.environ))
if CACHE_DIR is not None:  # before anything imports numba, which reads it once
    os.environ["NUMBA_CACHE_DIR"] = str(CACHE_DIR)


def load_tbb(env: dict[str, str]) -> str | None:
    """Load the `tbb` wheel's runtime into the process, where it is installed, and say which file.

    The pipeline's front and compute threads each run numba parallel regions at once. Under OpenMP
    each calling thread gets a team of its own, split into equal shares of the reads; TBB shares one
    pool between the regions and balances their work (on a 16-core GPU box, event detection on 16
    threads took 1.4 ns a sample under TBB against 2.3 under OpenMP, and three regions at once 0.84x
    OpenMP's time: `benchmarks/bench_events.py`). numba tries TBB first, but the wheel puts the library
    in the environment's `lib` folder, where the loader does not look for numba's layer.
    `NUMBA_THREADING_LAYER`, where set, is the user's choice and is left alone.
    """
    if env.get("NUMBA_THREADING_LAYER") or not sys.platform.startswith("linux"):
        return None
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, site.USER_BASE or "")):
        lib = Path(prefix) / "lib" / "libtbb.so.12"
        if prefix and lib.is_file():
            try:
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            return str(lib)
    return None


TBB = load_tbb(dict(os.environ))


class NoBlasProbe(importlib.abc.MetaPathFinder):
    """Answers numba's start-up check for BLAS with "none", without importing SciPy's linalg.

    numba and numba-cuda each look for BLAS as their array functions load, by importing `scipy.linalg`
    where SciPy is installed: 0.3-0.4 s of a GPU box's start-up, holding the GIL (0.4 s of `streamer
    call`'s 4.9, `benchmarks/RESULTS-cpu-half.md`). streamer's compiled code calls no BLAS; with the
    answer "none" numba only sums `np.cov`'s products in a loop. Every other import of `scipy.linalg`,
    numba's own included when a function it compiles calls BLAS, goes through.
    """

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 - importlib's protocol
        if fullname != "scipy.linalg":
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "_check_blas" and frame.f_globals.get("__name__", "").startswith("numba"):
                raise ModuleNotFoundError("BLAS is not looked for at start-up", name=fullname)
            frame = frame.f_back
        return None


sys.meta_path.insert(0, NoBlasProbe())  # before anything imports numba
