"""The run's timeline: a GPU stage's span carries its seconds by part, and nothing is kept when it is off."""

from __future__ import annotations

import json
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
