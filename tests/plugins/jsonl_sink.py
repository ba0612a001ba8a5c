"""A sink plugin of the tests, to show that a new output is a module and its entry point
(`streamer_test_sinks-0.dist-info/entry_points.txt` beside it): each call as a JSON line in
`calls.jsonl` of the output folder. It asks for the committed calls at a daemon's start-up
(`replays`), so the file is rewritten whole then and holds each committed call once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streamer.sinks import BaseSink, Result, SinkContext

JSONL = "calls.jsonl"


class JsonlSink(BaseSink):
    replays = True

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> JsonlSink | None:
        return cls(context.out_dir / JSONL) if context.out_dir is not None else None

    def __init__(self, path: Path):
        self.fh = open(path, "w")

    def on_batch(self, result: Result) -> None:
        calls = result.products.get("calls")
        for j in range(len(calls) if calls is not None else 0):
            i = int(calls.read[j])
            self.fh.write(json.dumps({"read": result.read_ids[i], "contig": result.ref_names[i],
                                      "strand": "-" if calls.strand[j] < 0 else "+", "start": int(calls.start[j]),
                                      "llr": round(float(calls.llr[j]), 2)}) + "\n")  # fmt: skip

    def refresh(self, final: bool = False) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()
