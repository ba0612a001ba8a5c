"""GPU kernels (numba-CUDA) and the device memory arena; an install extra (`streamer[gpu]`)."""
