"""Following a live job from outside: its ranks' processes looked at on this host, shared by
`diag watch` and `diag top` (one code, one verdict)."""
