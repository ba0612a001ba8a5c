"""The run's timeline: a GPU stage's span carries its seconds by part, a span the thread's CPU seconds in it, and
nothing is kept when it is off."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from streamer.pipeline import timeline


@dataclass
class Parts:
    n_reads: int
    t_kernels: float
    t_h2d: float


def test_a_stages_span_carries_its_measured_parts_and_nothing_when_not_recording(tmp_path, monkeypatch):
    monkeypatch.setattr(timeline, "_events", None)  # off (and off again after the test)
    timeline.record("abea", 0.0, 1.0, stats=Parts(3, 0.25, 0.125))
    timeline.start()
    timeline.record("abea", 1.0, 2.0, reads=3, stats=Parts(3, 0.25, 0.125))
    timeline.record("events", 2.0, 2.5, reads=3)
    timeline.write(tmp_path / "t.json")
    spans = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e.get("args")) for e in spans] == [
        ("abea", {"reads": 3, "t_kernels": 0.25, "t_h2d": 0.125}), ("events", {"reads": 3})]


def test_a_span_says_how_much_of_it_its_thread_worked(tmp_path, monkeypatch):
    """`cpu_ms` is the thread's CPU time in the span: next to nothing while it waits, all it worked otherwise
    (never more than the span, whatever else the machine runs)."""
    monkeypatch.setattr(timeline, "_events", None)
    timeline.start()
    with timeline.span("waits"):
        time.sleep(0.05)
    with timeline.span("works"):
        start = time.thread_time()
        while time.thread_time() - start < 0.02:
            pass
    timeline.write(tmp_path / "t.json")
    waits, works = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert waits["dur"] >= 50_000 and waits["args"]["cpu_ms"] < 10
    assert 20 <= works["args"]["cpu_ms"] <= works["dur"] / 1e3 + 1
