"""The live daemon: watching a run, joining, the exactly-once ledger, its decisions and shell."""
