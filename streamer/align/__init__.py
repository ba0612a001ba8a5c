"""Base-space alignment of basecalls that arrive without one: an FM-index of the reference, maximal
exact match seeds, chains and base-level extension, written once for the CPU (numba) and the GPU."""

# `alignment.engine`: mappy, or this package on the CPU or the GPU; auto: gpu where a GPU is there and agrees
# with mappy, else mappy
ENGINES = ("auto", "mappy", "cpu", "gpu")
