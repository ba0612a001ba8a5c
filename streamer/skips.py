"""Why a read produced no result: every read ends in calls or in one of these."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum


class Skip(IntEnum):
    """Per-read outcome codes, stored as int8 in batch arrays (0 means the read went through)."""

    OK = 0
    UNMAPPED = 1
    LOW_MAPQ = 2
    SECONDARY = 3
    NO_BASECALL = 4
    NO_SIGNAL = 5
    BAD_SIGNAL_FILE = 6
    NO_EVENTS = 7
    SHORT_READ = 8
    OVERSEGMENTED = 9
    ALIGNMENT_FAILED = 10
    RECALIBRATION_FAILED = 11
    QC_FAILED = 12
    NO_CPG = 13
    SPLICED = 14
    ULTRA_LONG = 15
    WORKER_FAILED = 16  # its batch failed twice on a cluster

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")


@dataclass(frozen=True)
class Skipped:
    """A read that produced no result, why, and where (file and detail for the log line)."""

    read_id: str
    reason: Skip
    detail: str = ""

    def message(self) -> str:
        tail = f": {self.detail}" if self.detail else ""
        return f"read {self.read_id}: skipped ({self.reason.label}){tail}"


INPUT_FAULTS = frozenset({Skip.NO_BASECALL, Skip.NO_SIGNAL, Skip.BAD_SIGNAL_FILE, Skip.WORKER_FAILED})


def log_skipped(log: logging.Logger, skipped: Iterable[Skipped]) -> None:
    """One line per skipped read: a warning where the input is at fault (a file to mend), else a debug
    line (shown with -v): a run has millions of reads, and its summary counts them by reason."""
    for s in skipped:
        log.log(logging.WARNING if s.reason in INPUT_FAULTS else logging.DEBUG, "%s", s.message())
