"""streamer: real-time nanopore signal analysis (events, ABEA, CpG methylation)."""

__version__ = "0.1.0"
