"""The result stream during a replayed run: the daemon, the real pipeline, real sockets."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from streams import local_config, no_leaks, tsv_rows  # noqa: F401 (no_leaks is a fixture)

from streamer import config
from streamer.publish.client import Calls, FreqUpdate, Gap, Snapshot, Subscriber
from streamer.daemon.shell import Daemon
from streamer.io.reference import Reference
from streamer.pipeline.stages import Pipeline, PipelineOptions
from streamer_plugins.cpg.caller import CpgCaller
from streamer.publish import Publisher
from streamer.daemon.replay import Replayer, ReplayOptions, load_source

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


@pytest.fixture(scope="module")
def pipeline():
    return Pipeline(PipelineOptions(threads=2), [CpgCaller()])


class _HeldPipeline:
    """The real pipeline, holding the second batch until released, so a subscriber can join mid-run."""

    def __init__(self, pipeline: Pipeline):
        self._pipeline = pipeline
        self._batches = 0
        self.holding, self.release = threading.Event(), threading.Event()

    def process(self, reads):
        self._batches += 1
        if self._batches == 2:
            self.holding.set()
            self.release.wait(30)
        return self._pipeline.process(reads)


class _Collector(threading.Thread):
    """Follows the stream to its end; `synced` once its snapshot has arrived."""

    def __init__(self, endpoint: str, topics: list[str]):
        super().__init__(name="collector")
        self.endpoint, self.topics = endpoint, topics
        self.synced = threading.Event()
        self.messages, self.missed, self.sites, self.error = [], None, None, None

    def run(self) -> None:
        try:
            with Subscriber(self.endpoint, self.topics) as sub:
                for msg in sub:
                    self.messages.append(msg)
                    if isinstance(msg, Snapshot):
                        self.synced.set()
                self.missed, self.sites = sub.missed, sub.frequencies.sites()
        except Exception as exc:  # surfaced by the test
            self.error = exc


def _freq_tsv(path: Path) -> dict:
    sites = {}
    for line in path.read_text().splitlines()[1:]:
        chrom, start, end, n, called, methylated, _, sequence = line.split("\t")
        called_, methylated_ = int(called), int(methylated)
        sites["hmm", chrom, int(start), int(end), ".", "m"] = (int(n), called_, methylated_, sequence,
                                                             called_ - methylated_, 0, 0, 0, 0, 0)
    return sites


def test_subscribers_get_every_call_and_a_late_joiner_the_same_frequencies(ecoli, reference_path, tmp_path,
                                                                           pipeline):
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    Replayer(load_source(ecoli), live, ReplayOptions(speed=0, batch_reads=3)).run()
    cfg = config.build({"watch.dir": live, "reference.genome": reference_path, "output.dir": out,
                        "watch.poll_interval": 0.05, "watch.settle": 0.2, "end.final_summary_grace": 0.2,
                        "batch.max_wait": 0.1, "batch.max_reads": 2, "service.status_interval": 0.1,
                        "pipeline.io_mode": "threads"})  # reader processes (the default) are run by test_daemon_e2e
    held = _HeldPipeline(pipeline)
    codes = []
    with Publisher(local_config()) as pub, Reference(reference_path) as reference:
        early = _Collector(pub.endpoints[0], ["meth", "run"])
        early.start()
        assert early.synced.wait(30)
        daemon = Daemon(cfg, held, reference, publisher=pub)
        runner = threading.Thread(target=lambda: codes.append(daemon.run()), name="daemon")
        runner.start()
        try:
            assert held.holding.wait(60)  # the second batch waits; the first is published (its sites' counts reach early)
            deadline = time.monotonic() + 60
            while not any(isinstance(m, FreqUpdate) for m in early.messages):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            late = _Collector(pub.endpoints[0], ["meth.freq"])
            late.start()
            assert late.synced.wait(30)
            held.release.set()
            runner.join(120)
        finally:
            held.release.set()
            daemon.close()
        pub.close()
        early.join(5)
        late.join(5)
    assert codes == [0] and early.error is None and late.error is None
    calls = [m for m in early.messages if isinstance(m, Calls)]
    assert [m.header.seq for m in calls] == list(range(1, len(calls) + 1))
    assert not any(isinstance(m, Gap) for m in early.messages) and early.missed == {}
    printed = (out / "meth.tsv").read_text().splitlines(keepends=True)[1:]
    assert len(printed) > 100 and [row for m in calls for row in tsv_rows(m.calls)] == printed
    late_snapshot = next(m for m in late.messages if isinstance(m, Snapshot))
    assert 0 < late_snapshot.header.seq and len(late_snapshot.sites) > 0  # it joined mid-run
    assert late.sites == early.sites == _freq_tsv(out / "meth-freq.tsv")
