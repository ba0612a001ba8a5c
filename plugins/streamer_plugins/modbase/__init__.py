"""Dorado's modified-base calls (MM/ML tags) aggregated per site exactly as modkit 0.4.4's pileup does.

`PileupCounts` is the incremental state (add batches of records, read rows at any time);
`streamer pileup` (command.py) is the offline command over BAM files.
"""
