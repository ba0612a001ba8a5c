"""Analyses that consume event alignments (CpG methylation, eventalign, frequencies)."""
