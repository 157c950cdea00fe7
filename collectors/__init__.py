"""In-process collectors, one module per signal, registered by name in `diag.agent.registry`.

Each registered module exposes `install(agent, undo) -> None` (agent: `diag.agent.api.AgentAPI`, what
a collector may touch): it registers hooks / class-level wrappers through
`undo` (so the agent can remove them all) and wraps every hook with `agent.guard(name, fn)` (so a bug
in a collector is counted, never raised into the job). Collectors import only the stdlib and what the
job already has (torch, deepspeed, megatron), never pandas or textual.
"""
