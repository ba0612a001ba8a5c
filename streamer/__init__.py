"""streamer: real-time nanopore signal analysis (events, ABEA, CpG methylation)."""

from __future__ import annotations

import os
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
