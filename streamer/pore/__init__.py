"""Pore models: the k-mer level tables and their parsing."""
