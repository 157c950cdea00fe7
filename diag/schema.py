"""Event schema: the record kinds a trace holds and the field order of each.

Hooks append flat tuples `(kind, *fields)` in the order declared here; the writer thread turns them
into JSON objects with `to_json`. Readers fill `DEFAULTS` for fields an older writer did not know and
keep fields they do not know, so the file format can grow without breaking either side.

Time: `ts` is an integer nanosecond timestamp on the wall clock (comparable across ranks of one
host); `dur` is nanoseconds. Hooks record `time.perf_counter_ns()`; the writer converts it with the
(wall, perf) pair taken at start, so the hot path never calls the slower wall clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diag.vocab import canonical_op

SCHEMA_VERSION = 1

STEP = "step"
LAYER = "layer"
COMM = "comm"
MEMORY = "memory"
OVERFLOW = "overflow"
ERROR = "error"
STATS = "stats"
META = "meta"
GPU = "gpu"
LOST = "lost"
COMM_OPEN = "comm_open"
PROC = "proc"
SCHED = "sched"

FIELDS: dict[str, tuple[str, ...]] = {
    # one optimizer step (a gradient-accumulation boundary); samples/tokens when the job tells us
    STEP: ("step", "ts", "dur", "samples", "tokens", "applied"),
    # one module's forward or backward on a sampled step; flops counted from real shapes
    LAYER: ("step", "module", "phase", "ts", "dur", "flops", "mem_delta"),
    # one collective or p2p op; group is the process group's name, module the one running at issue;
    # group_ranks omitted after a group of more than 8 ranks' first call of a step (`comm_line`;
    # readers fill it from that call: `trace.group_members`)
    COMM: (
        "step",
        "op",
        "bytes",
        "dtype",
        "group",
        "group_size",
        "group_ranks",
        "ts",
        "dur",
        "module",
        "async_op",
    ),
    # per step: device memory (bytes) from the allocator's host-side counters, and process RSS
    MEMORY: ("step", "ts", "device", "allocated", "reserved", "peak", "capacity", "rss", "module"),
    # one loss-scale update or non-finite check
    OVERFLOW: ("step", "ts", "overflow", "scale_before", "scale_after", "skipped_steps", "source"),
    # a collector failure: counted, never raised into the job
    ERROR: ("ts", "collector", "where", "exc", "message", "count"),
    # agent health: events captured / dropped / failed per collector, since start
    STATS: ("ts", "captured", "dropped", "errors", "ring_capacity", "ring_high_water"),
    # a header field learned after start (the engine appeared, the parallel layout was set up)
    META: ("ts", "key", "value"),
    # lines the writer could not write (disk full, I/O error): how many, which steps, why
    LOST: ("ts", "lines", "first_step", "last_step", "error"),
    # one GPU's health sample from NVML (the sidecar); missing values are null
    GPU: (
        "ts",
        "index",
        "util",
        "mem_used",
        "mem_total",
        "power_w",
        "power_limit_w",
        "sm_clock",
        "mem_clock",
        "temp_c",
        "throttle",
        "pcie_tx",
        "pcie_rx",
        "nvlink_tx",
        "nvlink_rx",
        "ecc_errors",
        "xid",
    ),
    # the watcher's looks at one rank's process over about a second (`diag watch`'s file
    # proc-<host>.jsonl, diag.live.proc_log): looks, how many saw it stopped (state T), how often it
    # resumed (T, then running or sleeping), the first and last look that saw it stopped (ns)
    PROC: (
        "ts",
        "of_rank",
        "pid",
        "span",
        "looks",
        "stopped",
        "resumes",
        "first_stop",
        "last_stop",
        "state",
        "exit",  # the wait status of a process seen dead (a zombie) in this second, else null
    ),
    # the training thread's CPU time and run-queue wait (runnable, waiting for a CPU), cumulative ns
    # from the kernel's schedstat, sampled by the agent's writer thread (diag.agent.sched)
    SCHED: ("ts", "cpu", "runq"),
}
# a collective entered and not completed after diag.agent.pending.OPEN_S: its `comm` record without
# a duration, written early (the `comm` record itself follows once it completes or is given up on),
# so the hang and desync rules see who waits in what seconds before the agent's 10 s hold ends
FIELDS[COMM_OPEN] = FIELDS[COMM]

# Meta keys shared by the writer (collectors) and the readers (analyzers, which cannot import diag.collectors)
META_ATTRIBUTE_EVERY = "attribute_every"  # module attribution of collectives runs 1 step in N
META_FLOPS_EVERY = "flops_every"  # layers: FLOPs counted on 1 sample in N of an input signature
META_ATTRIBUTION = "attribution"  # "matched": untracked steps' comms take their tracked match's module
META_UNCAUGHT = (
    "uncaught"  # the exception that ended the main thread: {exc, message, where, step, interrupted}
)
META_GROUPS = "groups"  # process groups seen: {name: {"role": "tp", "size": 2, "ranks": [0, 1]}}
META_UNFINISHED_AT_DETACH = "unfinished_at_detach"  # comms in flight when the agent stopped (count)
META_LAYER_NUMBERS = "layer_numbers"  # {module name: model-wide layer index} where it differs (PP stages)
META_STEP_ORIGIN = "step_origin"  # where step numbers come from: deepspeed, megatron, loop:NAME, optimizer,
# or attach (counted from the moment of attach: not the program's iteration)
STEP_OFFSET = "step_offset"  # in a rank's header (analysis): added to its attach-counted steps
META_ATTRIBUTED_STEP = "attributed_step"  # one meta record per step whose comms carry their module

# Megatron arguments its own TFLOPs formula reads (diag/metrics/model_flops.py): the agent copies them
# from the job's parsed arguments into the header's "model", the log importer from the arguments dump
# the job's layout as trace headers and log start-up dumps state it (`Trace.layout`, the log importer);
# a header may add where it ran (host, device, ds_config), which a log's dump does not carry
LAYOUT_KEYS = (
    "world_size",
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "sp",  # DeepSpeed-Ulysses degree (Megatron-DeepSpeed --ds-sequence-parallel-size): a factor of the world
    "zero_stage",
    "dtype",
    "micro_batch",
    "global_batch",
    "grad_accum",
    "model",
)
HEADER_KEYS = (*LAYOUT_KEYS, "ds_config", "host", "device_name")
# the parallel degrees (TUI header, the comms collector's roles that name one) and those whose product
# is the world (expert parallelism is carved out of data parallelism, not a factor of its own)
PARALLEL_KEYS = ("tp", "pp", "dp", "cp", "ep", "sp")
WORLD_FACTORS = ("tp", "pp", "dp", "cp", "sp")

MEGATRON_MODEL_ARGS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_query_groups",
    "group_query_attention",
    "kv_channels",
    "seq_length",
    "actual_seq_length",
    "padded_vocab_size",
    "swiglu",
    "micro_batch_size",
    "global_batch_size",
    "data_parallel_size",
    "world_size",
    "topk",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_layer_freq",
    "moe_shared_expert_intermediate_size",
    "checkpoint_activations",
    "recompute_granularity",
    "deepspeed",
)

# Defaults the reader fills for fields missing from a record (older writers, partial records).
DEFAULTS: dict[str, Any] = {
    "samples": None,
    "tokens": None,
    "applied": True,
    "flops": 0,
    "mem_delta": None,
    "group_ranks": None,
    "module": None,
    "async_op": False,
    "capacity": None,
    "rss": None,
}

# Bus-bandwidth factors of nccl-tests, as a function of the group size n.
_BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


def bus_factor(op: str, group_size: int) -> float:
    """nccl-tests' algbw -> busbw factor of an op (any spelling `vocab.canonical_op` knows; 1.0 for
    broadcast, p2p, ...)."""
    fn = _BUS_FACTOR.get(op) or _BUS_FACTOR.get(canonical_op(op))
    if fn is None or group_size <= 0:
        return 1.0
    return fn(group_size)


def lone(group_size: object, group_ranks: object) -> bool:
    """A call a rank made alone in its group: size 1 and one recorded member. It moves nothing
    between ranks, so its time is no communication (`diag.metrics.comms.alone` for frames; a size
    with no recorded members, an importer's guess of the world size, is not taken as alone)."""
    return group_size == 1 and isinstance(group_ranks, (list, tuple)) and len(group_ranks) == 1


def bus_bandwidth(bus_bytes: float, dur_ns: float) -> float:
    """THE bus bandwidth (GB/s, 1e9 bytes per second) of a set of calls: the bytes they moved, each
    call's scaled by its `bus_factor` and summed, over their summed duration; 0.0 without time.

    Every figure diag shows (agent records, `diag top`, `diag analyze`, `diag demo`) is this one, so
    a median or mean of per-call figures (dominated by the many one-element flag reductions) is never
    what a table calls busbw. `diag.metrics.bandwidth` is its vectorized form for frames."""
    return bus_bytes / dur_ns if dur_ns > 0 else 0.0  # bytes per ns == GB/s


def bandwidths(op: str, nbytes: int, dur_ns: int, group_size: int) -> tuple[float, float]:
    """(algbw, busbw) of one call in GB/s (`bus_bandwidth` of that call alone); 0.0 for a zero
    duration."""
    alg = bus_bandwidth(nbytes, dur_ns)
    return alg, alg * bus_factor(op, group_size)


_KEYS = {kind: ("k", *fields) for kind, fields in FIELDS.items()}  # a record's keys, its kind's first


def to_json(rec: tuple[Any, ...], wall0_ns: int, perf0_ns: int) -> dict[str, Any]:
    """Turn a hot-path tuple into the JSON object written to the trace (writer thread only)."""
    kind = rec[0]
    out: dict[str, Any] = dict(zip(_KEYS[kind], rec))
    ts = out.get("ts")
    if isinstance(ts, int):
        out["ts"] = wall0_ns + (ts - perf0_ns)
    if kind == COMM:
        out["algbw"], out["busbw"] = bandwidths(
            out["op"], out["bytes"] or 0, out["dur"] or 0, out["group_size"] or 0
        )
    return out
