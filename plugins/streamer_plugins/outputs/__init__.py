"""Outputs derived from the calls: the sinks, meth-freq, bedMethyl, modBAM."""
