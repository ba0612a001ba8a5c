"""A Jetson told from L4T's files (faked here: none of these machines is one), its `jetson-*` profile
picked from them, and every limit that profile sets shown by `streamer status` and the metrics."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamer.metrics import render, serve_metrics, status_of
from streamer.pipeline.gpu import GpuInfo
from streamer.tuning import PROFILES, Machine, pick_profile, plan
from streamer.tuning.board import Board, board_of, jetson_profile, read_board
from streamer.tuning.session import AutoTuner

GIB = 2**30
# as JetPack 6.0 writes it on an Orin
R36 = ("# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, DATE: Mon May  6 17:34:21 "
       "UTC 2024\n# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n"
       "TARGET_USERSPACE_LIB_DIR_PATH=usr/lib/aarch64-linux-gnu/nvidia\n")
R32 = ("# R32 (release), REVISION: 7.4, GCID: 33514132, BOARD: t210ref, EABI: aarch64, DATE: Fri Jun  9 04:25:08 "
       "UTC 2023\n")


@pytest.mark.parametrize("release, model, expected", [
    (R36, "NVIDIA Jetson AGX Orin Developer Kit\x00", Board("NVIDIA Jetson AGX Orin Developer Kit", "R36.3.0")),
    (None, "NVIDIA Orin NX Developer Kit\x00", Board("NVIDIA Orin NX Developer Kit")),
    (R32, None, Board("", "R32.7.4")),
    ("not L4T's format", "NVIDIA Jetson Nano Developer Kit", Board("NVIDIA Jetson Nano Developer Kit")),
    (None, "Raspberry Pi 4 Model B Rev 1.4\x00", None),
    (None, "NVIDIA DGX Station", None),
    (None, None, None),
])  # fmt: skip
def test_board_told_from_the_release_file_or_the_model(release, model, expected):
    assert board_of(release, model) == expected


def test_board_named_as_the_log_and_status_show_it():
    assert Board("NVIDIA Jetson AGX Orin Developer Kit", "R36.3.0").describe() == (
        "NVIDIA Jetson AGX Orin Developer Kit L4T R36.3.0")
    assert Board("", "R32.7.4").describe() == "Jetson (model not named) L4T R32.7.4"


@pytest.mark.parametrize("model, gib, release, expected", [
    ("NVIDIA Jetson AGX Orin Developer Kit", 64, 36, "jetson-orin"),
    ("NVIDIA Jetson AGX Orin Developer Kit", 32, 36, "jetson-orin"),
    ("NVIDIA Jetson Orin Nano Developer Kit", 8, 36, "jetson-orin-nano"),
    ("NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super", 8, 36, "jetson-orin-nano"),
    ("NVIDIA Jetson Orin NX Engineering Reference Developer Kit", 16, 36, "jetson-orin-nx"),
    ("NVIDIA Orin NX Developer Kit", 8, 35, "jetson-orin-nx"),  # the 8 GB NX: the name wins over the memory
    ("NVIDIA Jetson Xavier NX Developer Kit", 8, 35, "jetson-xavier"),
    ("NVIDIA Jetson AGX Xavier Developer Kit", 32, 35, "jetson-xavier"),
    ("NVIDIA Jetson TX2", 8, 32, "jetson-tx2"),
    ("NVIDIA Jetson Nano Developer Kit", 4, 32, "jetson-nano"),
    ("", 8, 36, "jetson-orin-nano"),  # an unnamed board on JetPack 6 is an Orin
    ("", 15.3, 36, "jetson-orin-nx"),
    ("", 7.6, 32, "jetson-tx2"),  # on an older L4T, by memory alone
    ("Orin", 61, None, "jetson-orin"),  # the GPU's name through CUDA
])  # fmt: skip
def test_profile_of_each_board(model, gib, release, expected):
    assert jetson_profile(model, int(gib * GIB), release) == expected
    assert expected in PROFILES


def test_faked_jetson_files_pick_its_profile_whatever_the_gpu(tmp_path):
    release, model = tmp_path / "nv_tegra_release", tmp_path / "model"
    release.write_text(R36)
    model.write_bytes(b"NVIDIA Jetson Orin Nano Developer Kit\x00")
    board = read_board(release, [tmp_path / "absent", model])
    assert board == Board("NVIDIA Jetson Orin Nano Developer Kit", "R36.3.0")
    orin = GpuInfo("Orin", 7 * GIB, 5 * GIB, True)  # CUDA's name does not tell the Orins apart
    for gpu in (orin, None):  # the board's profile with the GPU or without it (ABEA on the CPU)
        assert pick_profile(Machine(gpu, 6, int(7.4 * GIB), board)).name == "jetson-orin-nano"
    assert read_board(tmp_path / "absent", [tmp_path / "absent"]) is None
    assert pick_profile(Machine(None, 6, 8 * GIB, None)).name == "cpu"


def test_every_limit_the_profile_sets_is_in_status_and_metrics(tmp_path):
    board = Board("NVIDIA Jetson Orin NX Engineering Reference Developer Kit", "R36.3.0")
    p = plan(Machine(GpuInfo("Orin", 15 * GIB, 12 * GIB, True), 8, 15 * GIB, board),
             given={"max_lf": 4.0, "gpu_memory": "2G"})
    limits = p.limits()
    assert p.profile.name == "jetson-orin-nx" and set(limits) >= {"max_reads", "max_bases", "threads", "mem_frac"}
    # two of the eight cores left to MinKNOW; one budget for host and GPU, the basecaller's share held back
    assert (limits["max_reads"], limits["max_bases"], limits["threads"], limits["mem_frac"], limits["max_lf"]) == (
        1024, 5_000_000, 6, 0.6, 4.0)
    assert (limits["memory_budget"], limits["unified_memory"], limits["gpu_reserve"], limits["gpu_memory"],
            limits["stream_priority"]) == (3 * GIB, True, 4 * GIB, 2 * GIB, "low")  # fmt: skip
    status = status_of({"state": "running", "profile": p.as_dict()})
    assert status["profile"] == "jetson-orin-nx" and status["board"] == f"{board.model} L4T R36.3.0"
    assert {k: status[f"limit_{k}"] for k in limits} == limits

    shown = render(status).splitlines()[-1]
    assert shown.startswith(f"profile: jetson-orin-nx on {board.model} L4T R36.3.0; limits: ")
    numbers = {k: v for k, v in limits.items() if not isinstance(v, (bool, str))}
    assert all(f"{k} {v if isinstance(v, int) else format(v, 'g')}," in shown for k, v in numbers.items())
    assert "unified_memory yes" in shown and "stream_priority low" in shown

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stop = serve_metrics(str(port), lambda: status)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        stop()
    samples = {s.name: s for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert {k: samples[f"streamer_limit_{k}"].value for k in numbers} == numbers
    assert samples["streamer_limit_unified_memory"].value == 1
    info = samples["streamer_profile_info"]
    assert info.value == 1 and info.labels == {"profile": "jetson-orin-nx", "board": status["board"],
                                               "stream_priority": "low"}


def test_jetson_profiles_leave_cores_memory_and_the_gpu_first_to_minknow():
    """Every jetson-* profile: host and GPU one budget, a reserve for the basecaller, low-priority streams,
    two cores left; a user's key wins over each; other profiles keep every core and ordinary streams."""
    board = Board("NVIDIA Jetson Orin Nano Developer Kit", "R36.3.0")
    nano = Machine(GpuInfo("Orin", 7 * GIB, 5 * GIB, True, 8 * 1536), 6, int(7.4 * GIB), board)
    p = plan(nano)
    assert p.profile.name == "jetson-orin-nano" and p.threads == 4
    assert (p.gpu.reserve, p.gpu.stream_priority, p.profile.unified) == (3 * GIB, "low", True)
    mine = plan(nano, given={"threads": 6, "gpu_reserve": "1G", "stream_priority": "normal", "memory_budget": "1G"})
    assert (mine.threads, mine.gpu.reserve, mine.gpu.stream_priority, mine.budget) == (6, GIB, "normal", GIB)
    assert {mine.sources[k] for k in ("threads", "gpu_reserve", "stream_priority", "memory_budget")} == {"given"}
    for name, profile in PROFILES.items():
        jetson = name.startswith("jetson-")
        assert (profile.unified, profile.stream_priority == "low", profile.spare_cores > 0,
                profile.gpu_reserve > 0) == (jetson,) * 4  # fmt: skip
    h100 = plan(Machine(GpuInfo("NVIDIA H100 80GB HBM3", 80 * GIB, 79 * GIB, False), 16, 256 * GIB))
    assert (h100.threads, h100.gpu.reserve, h100.gpu.stream_priority, h100.profile.unified) == (16, 0, "normal", False)
    # events on the GPU, and the split left where it starts, on a workstation's or data centre's GPU; not on a
    # laptop's small one nor where a live basecaller shares it; a user's key wins
    laptop = plan(Machine(GpuInfo("NVIDIA GeForce RTX 4060 Laptop GPU", 8 * GIB, 7 * GIB, False), 8, 16 * GIB))
    assert laptop.profile.name == "laptop" and (laptop.gpu.events, laptop.gpu.balance) == (False, True)
    assert (h100.gpu.events, p.gpu.events, plan(Machine(None, 16, 64 * GIB)).gpu.events) == (True, False, False)
    assert (h100.gpu.balance, p.gpu.balance) == (False, True)
    assert [name for name, profile in PROFILES.items() if profile.events] == ["workstation", "hpc"]
    mine = plan(nano, given={"gpu_events": True, "gpu_balance": False})
    assert mine.gpu.events and not mine.gpu.balance
    mine = plan(h100.machine, given={"gpu_events": False, "gpu_balance": True})
    assert not mine.gpu.events and mine.gpu.balance
    assert h100.limits()["gpu_events"] is True and h100.limits()["gpu_balance"] is False
    assert AutoTuner.from_plan(h100, lambda s: None, autotune=True, settle_batches=1,
                               state_dir=None).controller.policy.balance is False  # fmt: skip
