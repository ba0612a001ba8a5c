"""The systemd units: `systemd-analyze verify` passes, and the settings the daemon relies on are there."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamer.cli import EXIT_CONFIG

UNITS = Path(__file__).resolve().parents[1] / "systemd"


def unit(name: str) -> configparser.ConfigParser:
    p = configparser.ConfigParser(strict=False, interpolation=None)
    p.optionxform = str
    p.read(UNITS / name)
    return p


@pytest.mark.parametrize("name", ["streamer.service", "streamer@.service"])
def test_unit_settings(name):
    svc = unit(name)["Service"]
    assert svc["Type"] == "notify" and svc["NotifyAccess"] == "main"
    assert svc["Restart"] == "on-failure" and svc["RestartPreventExitStatus"] == str(EXIT_CONFIG)
    assert svc["WatchdogSec"] and svc["ProtectSystem"] == "strict" and svc["NoNewPrivileges"] == "yes"
    assert "MemoryDenyWriteExecute" not in svc and "PrivateDevices" not in svc  # LLVM JIT, /dev/nvidia*
    assert "NUMBA_CACHE_DIR=%C/streamer/numba" in svc["Environment"]
    assert svc["ExecStart"].startswith("/opt/streamer/bin/streamer run --config /etc/streamer/streamer.yaml")


def test_jetson_drop_in_puts_minknow_first():
    svc = unit("jetson.conf")["Service"]
    assert (svc["Nice"], svc["CPUSchedulingPolicy"], svc["IOSchedulingClass"], svc["IOSchedulingPriority"]) == (
        "10", "batch", "best-effort", "7")
    text = (UNITS / "jetson.conf").read_text()
    assert "#MemoryMax=" in text and "#CPUAffinity=" in text and "streamer.service.d/jetson.conf" in text


def test_units_document_one_daemon_for_the_box_and_one_per_flow_cell():
    box, per_cell = (UNITS / "streamer.service").read_text(), (UNITS / "streamer@.service").read_text()
    assert "watch.each_run: true" in box and "streamer@.service" in box
    assert "#MemoryMax=" in per_cell and "gpu.mem_frac" in per_cell and "watch.each_run" in per_cell


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path):
    """Verified as installed: ExecStart pointed at this environment's `streamer`, the template instantiated."""
    exe = Path(sys.executable).with_name("streamer")
    assert exe.exists()
    for src, dest in (("streamer.service", "streamer.service"), ("streamer@.service", "streamer@FAK12345.service"),
                      ("jetson.conf", "streamer.service.d/jetson.conf")):  # fmt: skip
        text = (UNITS / src).read_text().replace("/opt/streamer/bin/streamer", str(exe))
        (tmp_path / dest).parent.mkdir(exist_ok=True)
        (tmp_path / dest).write_text(text)
    res = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / "streamer.service"),
                          str(tmp_path / "streamer@FAK12345.service")], capture_output=True, text=True, timeout=60)
    problems = [line for line in res.stderr.splitlines() if "streamer" in line]
    assert res.returncode == 0 and not problems, res.stderr
