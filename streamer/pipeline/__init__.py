"""The stage chain over a batch of reads, and the drivers that feed it."""
