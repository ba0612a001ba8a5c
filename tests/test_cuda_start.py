"""The CUDA driver begun beside a command's imports: which commands and which GPU, and nothing where
there is no driver, the simulator or --disable-cuda."""

from __future__ import annotations

import ctypes.util

from streamer.pipeline import cuda_start


def test_the_device_is_the_first_cuda_dev_id_names_and_none_without_cuda():
    assert cuda_start.device_of(["call", "-r", "x"]) == 0
    assert cuda_start.device_of(["call", "--cuda-dev-id", "2,3"]) == 2
    assert cuda_start.device_of(["call", "--cuda-dev-id=1"]) == 1
    assert cuda_start.device_of(["call", "--cuda-dev-id", "all"]) == 0
    assert cuda_start.device_of(["call", "--disable-cuda"]) is None


def test_only_the_one_shot_pipeline_commands_begin_it_and_it_ends_quietly_without_a_gpu(monkeypatch):
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    assert cuda_start.start("run", ["run"]) is None  # a daemon's start-up is not in every run's wall time
    assert cuda_start.start("call", ["call", "--disable-cuda"]) is None
    thread = cuda_start.start("call", ["call"])
    assert thread is not None
    thread.join(60)  # this machine has a driver or not: either way the thread ends, raising nothing
    assert not thread.is_alive()
    if ctypes.util.find_library("cuda") is None:  # no driver: no GPU start-up coming, no early readers
        assert not cuda_start.found(0.0)
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert cuda_start.start("call", ["call"]) is None

