"""`streamer status` and the Prometheus endpoint during a replayed run: the heartbeat's counters and
summary.json are those of the last committed batch (not of the last rewrite of the tables), and the
stream, the metrics and summary.json give the same numbers."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamer.cli import main
from streamer.commands.status import _from_stream
from streamer.metrics import COUNTERS, GAUGES, TUNING, parse_address, render, status_of

from conftest import ECOLI, REFERENCE

TIMEOUT = 120
CALLS = 790  # streamer call's rows on the fixture (tests/test_call.py)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name + "".join(f"{{{v}}}" for v in s.labels.values())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples if s.name.startswith("streamer_")}


def _as_status(metrics: dict[str, float]) -> dict[str, float]:
    """The scraped numbers under the status' names."""
    out = {name: metrics[f"streamer_{name}_total"] for name in COUNTERS}
    out.update({name: metrics[f"streamer_{name}"] for name in GAUGES})
    out.update({f"tuning_{k}": metrics[f"streamer_tuning_{k}"] for k in TUNING if f"streamer_tuning_{k}" in metrics})
    out.update({k.replace("streamer_", "", 1): v for k, v in metrics.items() if k.startswith("streamer_limit_")})
    out["state"] = next(k.split("{")[1].rstrip("}") for k, v in metrics.items() if k.startswith("streamer_state{") and v)
    return out


def _rows(path: Path) -> int:
    return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0


def _until(check, what: str):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            got = check()
        except OSError:  # the endpoint is not up yet
            got = None
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def daemon(tmp_path):
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    publish, metrics = f"tcp://127.0.0.1:{_port()}", _port()
    log = open(tmp_path / "daemon.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamer", "run", "--watch", str(live), "-g", str(REFERENCE), "-o", str(out),
         "--follow", "--settle", "0.3", "--poll-interval", "0.1", "--max-wait", "0.2", "--refresh-interval", "600",
         "--publish", publish, "--heartbeat-interval", "0.5", "--metrics", str(metrics), "--disable-cuda", "-t", "2"],
        stdout=log, stderr=subprocess.STDOUT)
    yield proc, live, out, publish, metrics, log
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    log.close()


def test_status_and_metrics_during_a_replay_equal_summary_json(daemon, tmp_path, capsys):
    proc, live, out, publish, port, log = daemon
    # the metrics answer once the daemon watches (models loaded, kernels warm)
    _until(lambda: _scrape(port).get("streamer_state{running}") == 1.0, "the daemon to run")
    replay = subprocess.Popen([sys.executable, "-m", "streamer", "replay", str(ECOLI), str(live), "--interval", "0.5",
                               "--batch-size", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = []  # the stream's calls while the replay runs: never behind by more than the batch in hand
    while replay.poll() is None:
        heartbeat = _from_stream(publish, 0.5)
        seen.append(heartbeat["calls"])
        assert heartbeat["calls"] <= _rows(out / "meth.tsv")
    assert replay.wait() == 0
    assert seen == sorted(seen)
    _until(lambda: _rows(out / "meth.tsv") == CALLS, "every call")
    # the tables wait for their 600 s refresh; the heartbeat and summary.json follow each committed batch
    heartbeat = _until(lambda: (h := _from_stream(publish, 0.5))["calls"] == CALLS and h, "a current heartbeat")
    raw = _scrape(port)
    scraped = _as_status(raw)
    running = status_of(json.loads((out / "summary.json").read_text()))

    proc.send_signal(signal.SIGTERM)  # summary.json is written once more as the daemon stops
    assert proc.wait(TIMEOUT) == 0, log.seek(0) or log.read()
    final = status_of(json.loads((out / "summary.json").read_text()))
    assert final["calls"] == CALLS and final["done"] == 8 and final["batches"] >= 2
    same = [*COUNTERS, "matched", "waiting_for_signal", "waiting_for_basecalls", "bases_per_busy_s", "latency_mean_s",
            "latency_max_s", *(k for k in final if k.startswith(("tuning_", "limit_")) and final[k] is not None)]
    assert {k: heartbeat[k] for k in same} == {k: final[k] for k in same}
    numbers = [k for k in same if not isinstance(final[k], str)]  # words are the info metric's labels
    assert {k: scraped[k] for k in numbers} == {k: float(final[k]) for k in numbers}
    info = [k for k in raw if k.startswith("streamer_profile_info")]
    assert info == ["streamer_profile_info{}{cpu}{normal}"] and final["limit_stream_priority"] == "normal"
    assert {k: running[k] for k in same} == {k: final[k] for k in same} and running["state"] == "running"
    assert heartbeat["state"] == scraped["state"] == "running" and final["state"] == "stopped"
    # the device profile and its limits as the run started: no GPU here (--disable-cuda), -t 2 given
    assert final["profile"] == "cpu" and final["limit_threads"] == 2 and final["limit_max_reads"] == 512
    assert "limit_mem_frac" not in scraped and final["limit_mem_frac"] is None  # no arena: no gauge

    assert main(["status", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == final
    assert main(["status", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == render(final) + "\n" and f"calls: {CALLS}" in printed


def test_status_of_a_folder_without_a_daemon_is_one_line(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'summary.json'}: no such file" in err


@pytest.mark.parametrize(("address", "expected"), [("9100", ("127.0.0.1", 9100)), ("0.0.0.0:9100", ("0.0.0.0", 9100)),
                                                   ("[::1]:9100", ("::1", 9100))])
def test_metrics_listen_on_loopback_unless_a_host_is_given(address, expected):
    assert parse_address(address) == expected


def test_a_bad_metrics_address_is_a_configuration_error(tmp_path, capsys):
    assert main(["validate-config", "/dev/null", "--watch", str(tmp_path), "-g", str(REFERENCE), "-o",
                 str(tmp_path / "out"), "--metrics", "localhost"]) == 78
    assert "service.metrics: 'localhost': expected PORT or HOST:PORT" in capsys.readouterr().err
