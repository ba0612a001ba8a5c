"""A user's mistakes: one line on stderr naming the problem, exit 2 for a wrong command line and 1
for a run that cannot be done, no traceback, and no file left behind (no output, no read index)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamer.cli import build_parser, main
from streamer.flags import _Bounded

DATA = Path(__file__).parent / "data"
ECOLI = DATA / "ecoli"
GENOME = DATA / "ecoli_k12_mg1655.fa.gz"


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    """The shipped example in a scratch folder (so a stray read index or output would show), as cwd."""
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    shutil.copy(ECOLI / "reads.bam", tmp_path / "reads.bam")
    (tmp_path / "calls.bam").write_bytes((ECOLI / "reads.bam").read_bytes())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STREAMER_DEBUG", raising=False)
    return tmp_path


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


def _call(*extra: str) -> list[str]:
    return ["call", "-r", "reads.fasta", "-b", "reads.bam", "-g", str(GENOME), "--signal", str(ECOLI / "fast5"), *extra]


MISTAKES = {
    # argv, exit status, what the line must say
    "reads missing": (["call", "-r", "nope.fasta", "-b", "reads.bam", "-g", str(GENOME)], 1, "nope.fasta: no such file"),
    "reads a folder": (["call", "-r", str(ECOLI), "-b", "reads.bam", "-g", str(GENOME)], 1, "a folder"),
    "output folder missing": (_call("-o", "nodir/o.tsv"), 1, "nodir/o.tsv: cannot write --output: no folder nodir"),
    "output a folder": (_call("-o", "."), 1, "takes a file name"),
    "bedmethyl folder missing": (_call("--bedmethyl", "nodir/m.bed"), 1, "cannot write --bedmethyl"),
    "genome missing": (["call", "-r", "reads.fasta", "-b", "reads.bam", "-g", "nope.fa"], 1, "nope.fa: no such file (-g/--genome)"),
    "meth-freq on a BAM": (["meth-freq", "calls.bam"], 1, "calls.bam: not a call-methylation TSV"),
    "meth-freq on FASTA": (["meth-freq", "reads.fasta"], 1, "reads.fasta:1: not a call-methylation header"),
    "meth-freq missing": (["meth-freq", "nope.tsv"], 1, "nope.tsv: no such file"),
    "subscribe bad endpoint": (["subscribe", "notanendpoint"], 2, "'notanendpoint' is not a ZeroMQ endpoint"),
    "eventalign reads missing": (["eventalign", "-r", "nope.fasta", "-b", "reads.bam", "-g", str(GENOME)], 1,
                                 "nope.fasta: no such file"),
    "FASTA as -b": (["call", "-r", "reads.fasta", "-b", "reads.fasta", "-g", str(GENOME)], 1,
                    "reads.fasta: not a BAM file (-b/--bam; it is FASTA)"),
    "FASTA as eventalign -b": (["eventalign", "-r", "reads.fasta", "-b", "reads.fasta", "-g", str(GENOME)], 1,
                               "not a BAM file"),
    "signal folder missing": (["call", "-r", "reads.fasta", "-b", "reads.bam", "-g", str(GENOME), "--signal", "nodir"],
                              1, "nodir: no such signal file or folder"),
    "replay source missing": (["replay", "nodir", "live"], 1, "nodir: no such folder"),
    "--resume without -o": (_call("--resume"), 2, "--resume needs -o FILE"),
    "a number that is not": (_call("-K", "many"), 2, "-K/--batchsize: expected an integer, got 'many'"),
    "not finite": (_call("--cuda-max-lf", "nan"), 2, "--cuda-max-lf: expected a finite number"),
}


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("case", MISTAKES)
def test_each_mistake_is_one_line_with_its_exit_status_and_leaves_no_file(case, inputs, capsys):
    argv, status, says = MISTAKES[case]
    before = _files(inputs), _files(DATA)
    assert main(argv) == status
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"streamer {argv[0]}: ") and says in line
    assert (_files(inputs), _files(DATA)) == before


def test_a_run_that_fails_after_opening_its_outputs_removes_them(inputs, capsys):
    """The CpG model is read once the outputs are open: a malformed one fails the run (exit 1)."""
    (inputs / "bad.model").write_text("#k\t6\nAAAAAA\tnot-a-number\n")
    before = _files(inputs)
    assert main(["-q", *_call("-o", "meth.tsv", "--bedmethyl", "meth.bed", "--meth-model", "bad.model")]) == 1
    assert "bad.model" in _one_line(capsys.readouterr().err)
    index = inputs / "reads.fasta.streamer-index.tsv"  # a cache of the signal files, valid whatever the run
    assert _files(inputs) - {index} == before  # no meth.tsv, meth.tsv.journal, meth.bed


def _numeric_flags():
    """Every checked numeric flag of every command, with a value below its minimum."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if isinstance(action, _Bounded) and action.minimum is not None:
                below = action.minimum - 1 if action.value_type is int else action.minimum - 0.01
                yield pytest.param(name, action.option_strings[-1], below, id=f"{name} {action.option_strings[-1]}")


def test_every_numeric_flag_is_checked():
    """No command takes a number without a range: each is a checked flag or a daemon config key."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    unchecked = [f"{name} {a.option_strings}" for name, sub in commands.choices.items() for a in sub._actions
                 if a.type in (int, float) and not a.dest.count(".")]  # config keys are checked by streamer.config
    assert unchecked == []


@pytest.mark.parametrize(("command", "flag", "below"), list(_numeric_flags()))
def test_each_numeric_flag_below_its_minimum_is_a_usage_error(command, flag, below, inputs, capsys):
    assert main([command, f"{flag}={below:g}"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"streamer {command}: {flag}") or f"/{flag}:" in line
    assert "must be at least" in line


@pytest.mark.parametrize("flag", ["-K", "-B", "--min-mapq", "-t"])
def test_call_and_the_daemon_refuse_the_same_values(flag, inputs, capsys):
    """One schema: what `call` refuses, `validate-config` (so `run`) refuses too, by the same key."""
    main(["call", flag, "-1"])
    call_line = _one_line(capsys.readouterr().err)
    key = call_line.split("(as config key ")[1].split(")")[0]
    assert main(["validate-config", os.devnull, flag, "-1", "--watch", ".", "-g", str(GENOME), "-o", "out"]) == 78
    assert f"{key}: must be at least" in _one_line(capsys.readouterr().err)


def test_no_traceback_unless_asked(inputs):
    """As a user runs it: a separate process, one line; STREAMER_DEBUG=1 shows the traceback."""
    argv = [sys.executable, "-m", "streamer", "meth-freq", "calls.bam"]
    env = {k: v for k, v in os.environ.items() if k != "STREAMER_DEBUG"}
    quiet = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert quiet.returncode == 1 and _one_line(quiet.stderr).startswith("streamer meth-freq: calls.bam: ")
    loud = subprocess.run(argv, capture_output=True, text=True, env={**env, "STREAMER_DEBUG": "1"})
    assert loud.returncode == 1 and "Traceback" in loud.stderr
