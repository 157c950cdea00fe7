"""Where is each rank now: py-spy stacks of every rank, grouped across ranks, joined with the
collectives each rank's agent has seen complete, to say who is stuck where and who never arrived."""
