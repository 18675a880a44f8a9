"""Recording: counters, distributions, graph ledger, events, snapshots."""
