"""`streamer call --resume`: a journal beside the output, so a killed run starts where it stopped.

`OUTPUT.journal` holds one JSON line naming the run (its inputs' paths, sizes and modification
times, and the options that change the output), then one line per batch written: the batch
number and the output's size after it, appended and fsynced once the rows are on disk. A
resumed run cuts the output back to the last journaled size (rows of a batch written but not
journaled are dropped and redone) and skips the batches before it; the plan is made the same
way, so it names the same batches. A journal of another run is refused, not trusted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from streamer.errors import InputError

VERSION = 2  # 2: the first batches ramp up to B (`plan_batches`), so a version 1 journal's batches differ
# Fault injection for tests: the process dies (as kill -9 would) once this many batches are journaled.
EXIT_AFTER_ENV = "STREAMER_FAULT_EXIT_AFTER_BATCHES"


def run_identity(inputs: Iterable[Path], options: Mapping[str, Any]) -> dict[str, Any]:
    """What must not change between a run and its resumption."""
    files = []
    for p in inputs:
        st = Path(p).stat()
        files.append([str(Path(p).resolve()), st.st_size, st.st_mtime_ns])
    return {"version": VERSION, "inputs": files, "options": {k: str(v) for k, v in sorted(options.items())}}


def journal_path(output: Path) -> Path:
    return output.with_name(output.name + ".journal")


@dataclass(frozen=True)
class Resumed:
    batches: int  # batches already written: the plan's first `batches` are skipped
    calls: int
    reads: int


class CallJournal:
    """Appends a line per written batch; `resume` reads one back and cuts the output to it."""

    def __init__(self, output: Path, identity: dict[str, Any]):
        self.path = journal_path(output)
        self.identity = identity
        self._fh: TextIO | None = None

    def resume(self, output: Path) -> Resumed:
        """Cut `output` back to the last batch journaled for this same run; Resumed(0, 0, 0) without a journal."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return Resumed(0, 0, 0)
        try:
            head = json.loads(lines[0]) if lines else None
        except ValueError:
            head = None
        if head != self.identity:
            raise InputError(self.path, "journal of another run (inputs or options differ): remove it, or "
                             "run without --resume to start over")  # fmt: skip
        done, calls, reads, offset = 0, 0, 0, len_of_header(output)
        size = output.stat().st_size if output.exists() else 0
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except ValueError:
                break  # a line torn by the kill
            if entry["offset"] > size:
                break
            done, calls, reads, offset = entry["batch"] + 1, entry["calls"], entry["reads"], entry["offset"]
        with open(output, "r+b") as fh:
            fh.truncate(offset)
        self._fh = open(self.path, "w")
        self._write(self.identity)
        if done:
            self._write({"batch": done - 1, "offset": offset, "calls": calls, "reads": reads})
        return Resumed(done, calls, reads)

    def start(self) -> None:
        """A fresh run: a journal with this run's identity and no batch."""
        self._fh = open(self.path, "w")
        self._write(self.identity)

    def batch_written(self, batch: int, offset: int, calls: int, reads: int) -> None:
        """After batch `batch`'s rows are flushed to the output, whose size is now `offset`."""
        self._write({"batch": batch, "offset": offset, "calls": calls, "reads": reads})
        if os.environ.get(EXIT_AFTER_ENV) == str(batch + 1):
            os._exit(137)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _write(self, entry: Mapping[str, Any]) -> None:
        assert self._fh is not None
        self._fh.write(json.dumps(entry) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())


def len_of_header(output: Path) -> int:
    """Bytes of the output's first line (the header): what a run with no batch written leaves."""
    try:
        with open(output, "rb") as fh:
            return len(fh.readline())
    except FileNotFoundError:
        return 0
