"""`diag diff`: compare a baseline run with a candidate and say where the time went.

Pipeline: two `Trace`s (one per side, loaded by `sides.load_side`) -> per-(rank, step) time split
(`split`) -> waterfall of mean per-step change (`waterfall`) -> aligned per-layer / per-collective /
memory / findings / config deltas (`align`, `config`) and Kineto op deltas (`kineto`) -> one JSON-able
document (`model.build`) -> renderers (`render`). Every figure diag's metrics already define is read
through `adapter`, the one module that imports `diag.metrics` and `diag.analyzers`.
"""
