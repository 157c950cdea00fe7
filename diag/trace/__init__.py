"""The trace file: per-rank JSON lines, written by the agent, read into pandas frames."""
