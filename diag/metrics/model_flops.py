"""Model FLOPs of one training iteration from the model's shape: Megatron's analytic formulas.

This is the "model FLOPs" view of MFU (what the model must compute, from layers, hidden size,
sequence length, vocabulary and batch), beside diag's measured count (what the ranks ran). Two
formulas, each exactly as its framework prints its own TFLOPs line, so diag agrees with the job's log:

- `megatron_deepspeed`: microsoft/Megatron-DeepSpeed `megatron/utils.py` `throughput_calculator`
  (f4157be, 2024-12): MACs of the QKV/output projections (with its integer `2 // gqa` for the K and V
  projections), the two attention batched GEMMs over the full s x s score matrix, the MLP (x3 with
  SwiGLU) and the logits; backward = 2x forward; +1x forward with full recomputation
  (`--checkpoint-activations` / `--recompute-granularity full`), + the attention GEMMs with selective
  recomputation. FLOPs = 2 x MACs. Its log line: `TFLOPs:`.
- `megatron_lm`: NVIDIA/Megatron-LM `megatron/training/training.py` `num_floating_point_operations`
  (d98e8a6, 2026-08), dense MHA/GQA path: 3 (fwd + 2 bwd) x 2 (FMA) x per-token GEMMs (QKV with
  query groups, output projection, MLP x2 or x3 with SwiGLU, logits) + the core attention over the
  causal half of s x s. Recomputation is NOT counted (model FLOPs). MoE layers (`moe_layer_freq`)
  count `moe_router_topk` routed experts and the shared expert; the router's GEMM is not counted.
  Its log line: `throughput per GPU (TFLOP/s/GPU)`. Older Megatron-LM releases counted the full
  s x s attention (no causal half): their lines differ from this by that term.

Both take Megatron's argument names (`num_layers`, `hidden_size`, `seq_length`, `padded_vocab_size`,
...) as the job's argument dump prints them; `from_options` maps the short `--model` spellings.
"""

from __future__ import annotations

from typing import Any

FORMULAS = ("megatron-deepspeed", "megatron-lm")
REQUIRED = ("num_layers", "hidden_size", "seq_length", "padded_vocab_size")
ALIASES = {
    "layers": "num_layers",
    "hidden": "hidden_size",
    "seq": "seq_length",
    "vocab": "padded_vocab_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "ffn": "ffn_hidden_size",
    "batch": "global_batch_size",
    "swiglu": "swiglu",
    "topk": "topk",
    "formula": "formula",
}


def _int(m: dict[str, Any], key: str, default: int) -> int:
    v = m.get(key)
    if isinstance(v, list):  # Megatron-DeepSpeed prints num_experts as [1]
        v = v[0] if v else None
    try:
        return int(v) if v is not None and v == v else default
    except (TypeError, ValueError):
        return default


def _true(m: dict[str, Any], key: str) -> bool:
    return m.get(key) in (True, "True", "true", 1, "1")


def _shape(m: dict[str, Any]) -> tuple[int, int, int, int, int, int, int]:
    """(layers, hidden, seq, vocab, heads, kv_heads, ffn)."""
    h = _int(m, "hidden_size", 0)
    heads = _int(m, "num_attention_heads", 1)
    groups = _int(m, "num_query_groups", heads) if _true(m, "group_query_attention") else heads
    kv = _int(m, "num_key_value_heads", groups)
    return (
        _int(m, "num_layers", 0),
        h,
        _int(m, "seq_length", 0),
        _int(m, "padded_vocab_size", 0),
        heads,
        kv,
        _int(m, "ffn_hidden_size", 4 * h),
    )


def batch_size(m: dict[str, Any]) -> int:
    """Samples per iteration: the global batch (micro batch x micro-batches x data parallel)."""
    gb = _int(m, "global_batch_size", 0)
    if gb:
        return gb
    return _int(m, "micro_batch_size", 1) * _int(m, "data_parallel_size", 1)


def megatron_deepspeed(m: dict[str, Any], batch: int) -> float:
    """Megatron-DeepSpeed's `throughput_calculator` FLOPs of one iteration of `batch` samples."""
    layers, h, s, vocab, heads, kv, ffn = _shape(m)
    s = _int(m, "actual_seq_length", s)
    head_dim = h // heads
    gqa = max(heads // max(kv, 1), 1)
    mult = 3 if _true(m, "swiglu") else 2
    topk = _int(m, "topk", 1)
    pre_post = batch * layers * (1 + (2 // gqa) + 1) * h * h * s
    attn = batch * layers * 2 * head_dim * heads * s * s
    mlp = batch * layers * mult * ffn * h * s * topk
    logits = batch * vocab * h * s
    fwd = pre_post + attn + mlp + logits
    total = 3 * fwd
    gran = str(m.get("recompute_granularity"))
    if _true(m, "checkpoint_activations") or gran == "full":
        total += fwd
    if gran == "selective":
        total += attn
    return 2.0 * total


def megatron_lm(m: dict[str, Any], batch: int) -> float:
    """Megatron-LM's `num_floating_point_operations` (dense MHA/GQA; every layer MoE with `topk`
    routed experts when `num_experts` is set) of one iteration of `batch` samples."""
    layers, h, s, vocab, heads, groups, ffn = _shape(m)
    kv_ch = _int(m, "kv_channels", h // heads)
    q, kv = kv_ch * heads, kv_ch * groups
    ffn_mult = 3 if _true(m, "swiglu") else 2
    moe = _moe_layers(m, layers)
    routed = _int(m, "moe_ffn_hidden_size", ffn) * _int(m, "moe_router_topk", 2)
    routed += _int(m, "moe_shared_expert_intermediate_size", 0)
    mlp = h * ffn_mult * (ffn * (layers - moe) + routed * moe)
    per_token = 6 * (mlp + layers * (h * (q + 2 * kv) + q * h) + h * vocab)
    core = 6 * q * layers  # 3 x 2 x q / 2 (causal half) x 2 (QK^T and AV), per s^2
    return float(batch * s * per_token + batch * s * s * core)


def _moe_layers(m: dict[str, Any], layers: int) -> int:
    """How many of the layers are MoE, as Megatron-LM counts them: none without `num_experts`
    (Megatron-DeepSpeed prints [1] for a dense model), else `moe_layer_freq`'s pattern: an int N is
    every Nth layer from the first (default 1: all), a list marks each layer 1 (MoE) or 0 (dense),
    as DeepSeek-V3's first three dense layers do."""
    experts = m.get("num_experts")
    experts = max(experts, default=1) if isinstance(experts, list) else experts
    if experts in (None, "None", 1, "[1]"):
        return 0
    freq = m.get("moe_layer_freq", 1)
    if isinstance(freq, list):
        return sum(1 for x in freq[:layers] if x)
    every = _int(m, "moe_layer_freq", 1)
    return len(range(0, layers, every)) if every > 0 else layers


def formula_of(m: dict[str, Any]) -> str:
    """Which framework's formula fits this job: the one whose log line it prints."""
    named = str(m.get("formula") or "")
    if named in FORMULAS:
        return named
    deepspeed = _true(m, "deepspeed") or "num_key_value_heads" in m or "topk" in m
    return "megatron-deepspeed" if deepspeed else "megatron-lm"


def iteration_flops(m: dict[str, Any], batch: int | None = None) -> tuple[float, str] | None:
    """(FLOPs of one iteration, formula name), or None when the shape is not known."""
    if any(_int(m, k, 0) <= 0 for k in REQUIRED):
        return None
    name = formula_of(m)
    fn = megatron_deepspeed if name == "megatron-deepspeed" else megatron_lm
    return fn(m, batch or batch_size(m)), name


def from_options(text: str) -> dict[str, Any]:
    """`layers=2,hidden=64,seq=64,vocab=1024,heads=4,batch=8` -> Megatron argument names.
    Raises ValueError with a one-line message."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = ALIASES.get(key.strip(), key.strip())
        if not sep or not value.strip():
            raise ValueError(f"--model: expected KEY=VALUE, got {part!r}")
        v = value.strip()
        if key in ("formula", "recompute_granularity"):
            out[key] = v
        else:
            out[key] = v.lower() == "true" if key == "swiglu" else _num(v)
    missing = [k for k in REQUIRED if k not in out]
    if missing:
        raise ValueError(
            f"--model: missing {', '.join(missing)} (e.g. layers=24,hidden=1024,seq=2048,"
            "vocab=50304,batch=512)"
        )
    return out


def _num(v: str) -> int:
    try:
        return int(float(v))
    except ValueError:
        raise ValueError(f"--model: {v!r} is not a number") from None
