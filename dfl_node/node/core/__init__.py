"""What every part of the node reads: its clock, its log names, what its network is built from (identity), its round
progress, its counters (tally) and the INFO lines it writes (reports)."""
