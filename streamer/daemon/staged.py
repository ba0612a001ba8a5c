"""A staged run: a finished run's batch files written once, then moved into a live folder at a pace.

Writing signal files in Python (POD5 at about 1.3 Mbases/s) is slower than the daemon it feeds,
so a benchmark writes them ahead (`stage`): the run folder exactly as the writing replay leaves
it (signal, FASTQ and BAM batch files, the sequencing summary, the final summary), plus a
hidden manifest of each batch's files, bases and end time. `replay_staged` then only renames:
every file is first linked (or, on another file system, copied) into the live run's hidden
`.replay/` before the clock starts, then renamed into place on the plan's schedule, so each
file appears whole and the pace costs almost nothing; the final summary lands last.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from streamer.daemon.replay import STAGING, Replayer, Source
from streamer.daemon.replay_plan import BatchTiming, Landing, Pace, ReplayOptions, follow, plan
from streamer.errors import InputError

MANIFEST = ".replay.json"  # hidden: a watcher of the staged folder ignores it


@dataclass(frozen=True)
class StagedRun:
    """A staged run folder and what its manifest says."""

    root: Path
    timings: list[BatchTiming]
    files: list[dict[str, str]]  # per batch: kind (signal, fastq, bam) -> path under root
    closing: list[str]  # the sequencing summary, then the final summary
    bam: bool


def stage(src: Source, into: Path, opts: ReplayOptions, started: datetime | None = None, workers: int = 1) -> Path:
    """Write the run's batch files once into a run folder under `into`, with the manifest; its path.

    The pace options do not apply here: they are the fast replay's. `started` (now by default)
    names the run folder and dates its reads, as in `Replayer`. `workers` processes write the batch
    files at once (the same bytes as one).
    """
    fastest = replace(opts, speed=0, interval=None, mbases_per_s=None, mode="move", write_seconds=0.0, basecall_lag=0.0)
    replayer = Replayer(src, into, fastest, started=started)
    run_dir = replayer.run(workers)
    kinds = ("signal", "fastq", "bam") if replayer.bam else ("signal", "fastq")
    manifest = {
        "bam": replayer.bam,
        "batches": [{"end_s": t.end_s, "bases": t.bases,
                     "files": {k: str(replayer.dest(i, k).relative_to(run_dir)) for k in kinds}}
                    for i, t in enumerate(replayer.timings)],  # fmt: skip
        "closing": [p.name for p in replayer.closing()],
    }
    (run_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return run_dir


def load_staged(root: Path) -> StagedRun | None:
    """The staged run at `root`; None when `root` is not one (a finished run to write from)."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text())
        batches = m["batches"]
        staged = StagedRun(Path(root), [BatchTiming(float(b["end_s"]), int(b["bases"])) for b in batches],
                           [dict(b["files"]) for b in batches], list(m["closing"]), bool(m["bam"]))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(path, f"not a staged run's manifest: {exc}") from exc
    missing = [f for f in _all_files(staged) if not (staged.root / f).is_file()]
    if missing:
        raise InputError(staged.root / missing[0], f"staged file missing ({len(missing)} of the manifest's)")
    return staged


def _all_files(staged: StagedRun) -> list[str]:
    return [f for files in staged.files for f in files.values()] + staged.closing


def replay_staged(staged: StagedRun, live: Path, opts: ReplayOptions, *, keep: bool = False,
                  sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> tuple[Path, Pace]:
    """Move the staged files into `live` on the plan's pace; the live run folder and the pace kept.

    The staged folder is used up unless `keep`.
    """
    run_dir = Path(live) / staged.root.name
    if run_dir.exists() and any(p.name != STAGING for p in run_dir.iterdir()):
        raise InputError(run_dir, "already holds a run: replay into another folder")
    hidden = run_dir / STAGING
    hidden.mkdir(parents=True, exist_ok=True)
    try:
        for rel in _all_files(staged):
            _place(staged.root / rel, hidden / Path(rel).name)
        landings = plan(staged.timings, opts, staged.bam)

        def land(landing: Landing) -> None:
            _land(hidden, run_dir, staged.files[landing.batch][landing.kind])

        t0 = clock()
        follow(landings, land, t0, sleep=sleep, clock=clock)
        for rel in staged.closing:
            _land(hidden, run_dir, rel)
        pace = Pace.kept(staged.timings, landings, clock() - t0)
    finally:
        shutil.rmtree(hidden, ignore_errors=True)
    if not keep:
        shutil.rmtree(staged.root)
    return run_dir, pace


def _place(src: Path, tmp: Path) -> None:
    """A hard link where the file systems allow one (nothing copied), else a copy."""
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)


def _land(hidden: Path, run_dir: Path, rel: str) -> None:
    dest = run_dir / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(hidden / Path(rel).name, dest)
