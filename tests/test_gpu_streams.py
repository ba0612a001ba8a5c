"""Low-priority CUDA streams: with `gpu.stream_priority: low` every launch and copy of ABEA, event
detection and the CpG HMM goes on its stage's stream, asked for at low priority; the simulator, which
has no priorities, gives an ordinary stream and the same answers as the CPU (tests/gpu_stream_cases.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_gpu_abea import HAS_CUDA_MODULE, case_env

CASES = Path(__file__).parent / "gpu_stream_cases.py"


@pytest.fixture(scope="module")
def cases() -> dict:
    if not HAS_CUDA_MODULE:
        pytest.skip("neither numba-cuda nor numba's built-in CUDA target is installed")
    env = case_env() | {"NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run([sys.executable, str(CASES)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("stage", ["abea", "events", "hmm"])
def test_every_launch_and_copy_takes_the_stage_stream(cases, stage):
    got = cases[stage]
    assert got["n"] > 0 and got["on_stage_stream"] == got["n"] and got["elsewhere"] == []
    assert got["same"]  # the CPU's answers
    assert got.get("n_gpu", 1) > 0 and got.get("on_gpu", True)  # the work ran on the (simulated) device


def test_each_stage_asks_for_the_configured_priority(cases):
    assert cases["asked"] == [["streamer_gpu.abea", "low"], ["streamer_gpu.events", "low"],
                              ["streamer_plugins.cpg.hmm_cuda", "low"]]  # fmt: skip
    # the simulator has no priorities: an ordinary stream, no driver number
    assert cases["low_stream"] == {"asked": "low", "number": None}
    assert "expected one of normal, low, high" in cases["bad_priority"]


def test_config_and_flags_reach_the_stages_options(tmp_path):
    from streamer import config
    from streamer.commands.run import cuda_options

    cfg = config.load(None, {"gpu.stream_priority": "low", "gpu.reserve": "2G", "gpu.memory": "3G"}, require=())
    options = cuda_options(cfg)
    assert (options.stream_priority, options.reserve, options.memory_cap) == ("low", 2 << 30, 3 << 30)
    plain = cuda_options(config.Config())  # unresolved `auto`: ordinary streams, nothing reserved, no cap
    assert (plain.stream_priority, plain.reserve, plain.memory_cap) == ("normal", 0, None)
