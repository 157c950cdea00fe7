"""The control channel of an attached process: a private Unix socket with a few fixed commands.

`server` runs inside the job (stdlib only); `client` is what `diag status/detach/stacks` use;
`protocol` holds what both must agree on (paths, message framing, the command list).
"""
