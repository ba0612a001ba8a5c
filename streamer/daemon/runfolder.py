"""The files of a run folder: which ones the daemon reads, their kind and format, the run each
belongs to, and whether a file is complete by its format's own test (`check_complete`).

Pure decisions over names and file contents, no threads: the watcher (`streamer.daemon.watch`)
asks them of each file it meets, and `streamer replay` lays out a run the same way.
"""

from __future__ import annotations

import enum
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from streamer.errors import InputError
from streamer.io import bamreads, fast5, fastx, pod5, slow5

SIGNAL_DIRS = ("fast5", "pod5", "slow5", "blow5")  # prefixes: fast5_pass, pod5_fail, ...
BASECALL_DIRS = ("fastq", "bam")
TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".partial", "~", ".swp")
COUNTED_FORMATS = ("fast5", "pod5", "blow5", "slow5", "fastq", "bam")  # what a final_summary may count


class Kind(enum.Enum):
    SIGNAL = "signal"
    BASECALLS = "basecalls"
    FINAL_SUMMARY = "final_summary"
    STOP = "stop"


class Verdict(enum.Enum):
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    CORRUPT = "corrupt"


@dataclass(frozen=True)
class RunFile:
    """A file of the run that the daemon reads, with its format and the run folder it belongs to."""

    path: Path
    kind: Kind
    fmt: str  # fast5 pod5 blow5 slow5 fastq fasta bam text
    run_root: Path
    spare: bool = False  # FASTQ/FASTA of a run that writes BAM: used for reads whose BAM record cannot be read


def file_format(name: str) -> tuple[Kind, str] | None:
    """(kind, format) from a file name, or None for files the daemon does not read."""
    lower = name.lower()
    base = lower[:-3] if lower.endswith(".gz") else lower
    for suffix, kind, fmt in (
        (".fast5", Kind.SIGNAL, "fast5"), (".pod5", Kind.SIGNAL, "pod5"), (".blow5", Kind.SIGNAL, "blow5"),
        (".slow5", Kind.SIGNAL, "slow5"), (".bam", Kind.BASECALLS, "bam"), (".fastq", Kind.BASECALLS, "fastq"),
        (".fq", Kind.BASECALLS, "fastq"), (".fasta", Kind.BASECALLS, "fasta"), (".fa", Kind.BASECALLS, "fasta"),
    ):
        if (base if fmt in ("fastq", "fasta") else lower).endswith(suffix):
            return kind, fmt
    return None


TAIL_MARKED = ("pod5", "blow5", "bam")  # complete iff the last bytes say so: checked whenever seen


def tail_marked(fmt: str) -> bool:
    """Whether a few bytes at the end tell this format's completeness (gzip needs a full read)."""
    return fmt in TAIL_MARKED


def check_complete(path: Path, fmt: str) -> tuple[Verdict, str]:
    """Whether `path` is complete, by the cheapest test its format's reader offers; reason when not."""
    try:
        size = path.stat().st_size
        if size == 0:
            return Verdict.INCOMPLETE, "empty file"
        os.close(os.open(path, os.O_RDONLY))  # unreadable files are told apart from incomplete ones
        if fmt in _END_MARKED:
            is_complete, missing = _END_MARKED[fmt]
            return (Verdict.COMPLETE, "") if is_complete(path) else (Verdict.INCOMPLETE, missing)
        if fmt == "fast5":
            try:
                fast5.fast5_read_ids(path)
            except InputError as exc:
                return Verdict.INCOMPLETE, exc.reason
            return Verdict.COMPLETE, ""
        verdict, reason = fastx.text_completeness(path)
        return Verdict(verdict), reason
    except PermissionError as exc:
        return Verdict.CORRUPT, f"cannot read ({exc.strerror or exc})"
    except OSError as exc:
        return Verdict.INCOMPLETE, f"cannot read ({exc.strerror or exc})"


@dataclass(frozen=True)
class FilesWritten:
    """The files a run wrote, by format, as its final_summary counts them: into the run folder, and
    into MinKNOW's fallback folder (elsewhere, when the run folder could not take them)."""

    final_dest: dict[str, int]
    fallback: dict[str, int]


def files_written(text: str) -> FilesWritten:
    """The `<fmt>_files_in_final_dest` and `<fmt>_files_in_fallback` counts of a final_summary's
    text. A format it does not list (older MinKNOW lists none), or a value that is not a count, is
    left out: nothing is known of it."""
    counts: dict[str, dict[str, int]] = {"final_dest": {}, "fallback": {}}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        fmt, _, where = key.strip().partition("_files_in_")
        if fmt in COUNTED_FORMATS and where in counts and value.strip().isdigit():
            counts[where][fmt] = int(value)
    return FilesWritten(counts["final_dest"], counts["fallback"])


_END_MARKED = {
    "pod5": (pod5.pod5_is_complete, "no POD5 end signature"),
    "blow5": (slow5.slow5_is_complete, "no BLOW5 end-of-file marker"),
    "bam": (bamreads.bam_is_complete, "no BGZF end-of-file block"),
}


@dataclass
class RunLayout:
    """Which files under the watched folder the daemon reads, and the run folder of each.

    MinKNOW writes `{run}/fast5_pass/…`, `{run}/fastq_pass/barcode01/…` and so on; the run
    folder is the parent of such a data folder. Elsewhere (a plain folder of files) a file's
    run folder is its own folder. Hidden and temporary files, the daemon's own output folders
    and, unless asked for, `*_fail` and `*_skip` folders are left alone. With `basecalls: auto`
    the FASTQ of a run that writes BAM is marked `spare`: the choice is made read by read.
    """

    root: Path
    stop_file: str = "STOP"
    include_fail: bool = False
    basecalls: str = "auto"  # auto | bam | fastq
    exclude: tuple[Path, ...] = ()
    _bam_dirs: set[Path] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.root = Path(os.path.abspath(self.root))
        self.exclude = tuple(Path(os.path.abspath(p)) for p in self.exclude)

    def note_listing(self, paths: Iterable[Path]) -> None:
        """Remember folders holding BAM files (for `basecalls: auto`) before classifying a scan."""
        self._bam_dirs.update(p.parent for p in paths if p.name.lower().endswith(".bam"))

    def classify(self, path: Path) -> RunFile | None:
        path = Path(os.path.abspath(path))
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            return None
        if any(path == e or e in path.parents for e in self.exclude):
            return None
        parts = rel.parts
        if not parts or any(p.startswith(".") for p in parts) or parts[-1].lower().endswith(TEMP_SUFFIXES):
            return None
        name = parts[-1]
        if len(parts) == 1 and name == self.stop_file:
            return RunFile(path, Kind.STOP, "text", self.root)
        data_dir = next((i for i, p in enumerate(parts[:-1]) if _is_data_dir(p)), None)
        if data_dir is not None and not self.include_fail and _is_fail_dir(parts[data_dir]):
            return None
        run_root = self.root.joinpath(*parts[:data_dir]) if data_dir is not None else path.parent
        if name.startswith("final_summary") and name.endswith(".txt"):
            return RunFile(path, Kind.FINAL_SUMMARY, "text", path.parent)
        kf = file_format(name)
        if kf is None:
            return None
        kind, fmt = kf
        if kind is Kind.BASECALLS and not self._wanted_basecalls(path, fmt):
            return None
        spare = kind is Kind.BASECALLS and fmt != "bam" and self._writes_bam(path, run_root)
        return RunFile(path, kind, fmt, run_root, spare)

    def left_alone(self, run_root: Path) -> Counter[str]:
        """The run's files the daemon does not read by choice, by format: those of `*_fail` and
        `*_skip` folders unless `include_fail`, basecalls of the format not used. A final_summary
        counts them with the rest."""
        out: Counter[str] = Counter()
        for folder, dirs, names in os.walk(run_root):
            dirs[:] = [d for d in dirs if not d.startswith(".") and Path(folder, d) not in self.exclude]
            for name in names:
                kf = file_format(name)
                if (kf is not None and kf[1] in COUNTED_FORMATS and not name.startswith(".")
                        and not name.lower().endswith(TEMP_SUFFIXES) and self.classify(Path(folder, name)) is None):
                    out[kf[1]] += 1
        return out

    def _wanted_basecalls(self, path: Path, fmt: str) -> bool:
        if fmt == "bam":
            self._bam_dirs.add(path.parent)
            return self.basecalls in ("auto", "bam")
        return self.basecalls in ("auto", "fastq")

    def _writes_bam(self, path: Path, run_root: Path) -> bool:
        """`basecalls: auto` and the run writes BAM: its FASTQ is the spare source, read by read."""
        return self.basecalls == "auto" and ((run_root / "bam_pass").is_dir() or path.parent in self._bam_dirs)


def _is_data_dir(name: str) -> bool:
    lower = name.lower()
    return any(lower == d or lower.startswith(d + "_") for d in SIGNAL_DIRS + BASECALL_DIRS)


def _is_fail_dir(name: str) -> bool:
    lower = name.lower()
    return lower.endswith("_fail") or lower.endswith("_skip")
