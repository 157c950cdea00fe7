"""`diag top`: the Textual terminal UI. The only package that imports textual.

model.py aggregates trace events into view state (pure python, testable without textual);
source.py / tail.py feed it from a live trace directory, a pid or a replayed trace; app.py and
widgets/ render it.
"""
