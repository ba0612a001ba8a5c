"""CpG methylation calling with the nanopolish profile HMM."""
