"""Chunk sizes of numba's parallel loops: each nesting and each thread gets back the size it had, also
after a pipeline's stages, which nest them (a stage's size around the event detector's own)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numba

from streamer.pipeline.chunks import chunked
from streamer.pipeline.gpu import CudaOptions
from streamer.pipeline.stages import Pipeline, PipelineOptions


def on_a_fresh_thread(fn):
    """fn() on a thread of its own, which starts at numba's default size (0)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def test_nested_blocks_each_restore_the_size_they_replaced():
    def nested():
        seen = []
        with chunked(1):
            seen.append(numba.get_parallel_chunksize())
            with chunked(8):
                seen.append(numba.get_parallel_chunksize())
            seen.append(numba.get_parallel_chunksize())
        seen.append(numba.get_parallel_chunksize())
        return seen

    assert on_a_fresh_thread(nested) == [1, 8, 1, 0]


def test_threads_in_blocks_at_once_keep_their_own_sizes():
    inside = threading.Barrier(2)
    out = threading.Barrier(2)

    def block(size):
        with chunked(size):
            inside.wait(10)  # both inside: each entered while the other's block was open
            held = numba.get_parallel_chunksize()
            out.wait(10)
        return held, numba.get_parallel_chunksize()

    with ThreadPoolExecutor(2) as pool:
        got = [f.result() for f in [pool.submit(block, 1), pool.submit(block, 8)]]
    assert got == [(1, 0), (8, 0)]


def test_a_pipeline_leaves_its_thread_at_the_size_it_found():
    def start_and_run():
        pipeline = Pipeline(PipelineOptions(threads=2, cuda=CudaOptions(disable=True)))  # the warm-up runs every stage
        return pipeline.warm_up_result is not None, numba.get_parallel_chunksize()

    assert on_a_fresh_thread(start_and_run) == (True, 0)
