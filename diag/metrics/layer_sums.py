"""The top-layers table of a diag trace from sums of its layer records per (module, rank, warm-up or
not): what the report reads of them, small (per module and rank, not per record), in the form the
windowed pass sums a window of steps at a time and merges (issue 14, `diag.metrics.reduction`).

Exact across windows: a step's records lie in one window, so distinct steps add up, and integer
sums (ns, FLOPs, bytes) do not depend on their order. The choices that read every rank's records
(a rank with a steady sample drops its warm-up's, each module's lowest rank) are made on the
merged sums (`chosen`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

KEYS = ["module", "rank", "warm"]
COLUMNS = ["module", "steps", "fwd_ms", "bwd_ms", "flops", "tflops", "mfu", "mem_delta", "warmup"]
_MODULES = [*KEYS, "steps", "flops", "mem", "mem_n"]
_PHASES = [*KEYS, "phase", "dur"]


class Sums(NamedTuple):
    """`modules`: per (module, rank, warm): distinct steps, FLOPs summed, the forward records'
    mem_delta summed and counted (mem, mem_n); `phases`: per (module, rank, warm, phase): dur
    summed. Rows sorted by their keys; a record of no module is kept (its rank's steady sample)."""

    modules: pd.DataFrame
    phases: pd.DataFrame


EMPTY = Sums(pd.DataFrame(columns=_MODULES), pd.DataFrame(columns=_PHASES))


def of_records(layers: pd.DataFrame, warm: np.ndarray) -> Sums:
    """The sums of `layers` (layer records: module, rank, step, phase, dur, flops, mem_delta),
    `warm` marking each record of a warm-up step. Grouped by the codes of one integer key per record
    (a frame of the keyed columns grouped by them peaked +155 MiB at 64 ranks x 1,000 steps,
    1,024,000 records; this +53, `steady_rows` before it +43)."""
    if layers.empty:
        return EMPTY
    key, modules = pd.factorize(layers["module"], use_na_sentinel=False)
    rcode, ranks = pd.factorize(layers["rank"], sort=True)
    key = key.astype(np.int64, copy=False)  # (in place below: each temporary a record's 8 bytes)
    key *= len(ranks)
    key += rcode
    key *= 2
    key += np.asarray(warm)
    del rcode
    ids, keys = pd.factorize(key)  # one hash of every record's key: the sums group by its codes
    del key
    flops = pd.to_numeric(layers["flops"], errors="coerce").groupby(_by(ids, len(keys)), observed=False).sum()
    pairs, steps = pd.factorize(layers["step"])
    pairs = pairs.astype(np.int64, copy=False)
    known = pairs >= 0
    pairs += ids * len(steps)
    pairs = pd.unique(pairs if known.all() else pairs[known])  # distinct (key, step)
    mem = layers["mem_delta"] if "mem_delta" in layers else pd.Series(np.nan, index=layers.index)
    fwd = ((layers["phase"] == "fwd") & mem.notna()).to_numpy()  # the forward's (of a few records on CPU)
    g = pd.to_numeric(mem[fwd], errors="coerce").groupby(_by(ids[fwd], len(keys)), observed=False)
    per = pd.DataFrame(
        {
            "steps": np.bincount(pairs // max(len(steps), 1), minlength=len(keys)).astype(np.int64),
            "flops": flops.to_numpy(),
            "mem": g.sum().to_numpy().astype(np.float64),
            "mem_n": g.count().to_numpy().astype(np.int64),
        }
    )
    pcode, phases = pd.factorize(layers["phase"], use_na_sentinel=False)
    pcode = pcode.astype(np.int64, copy=False)
    pcode += ids * len(phases)
    dur = layers["dur"].groupby(_by(pcode, len(keys) * len(phases)), observed=False).sum().to_numpy()
    seen = np.flatnonzero(np.bincount(pcode, minlength=len(keys) * len(phases)))  # (key, phase)s with records
    by_phase = _keyed(keys[seen // len(phases)], modules, ranks).assign(
        phase=np.array([str(p) for p in phases], dtype=object)[seen % len(phases)], dur=dur[seen]
    )
    by_module = pd.concat([_keyed(keys, modules, ranks), per], axis=1)
    return Sums(_sorted(by_module, KEYS), _sorted(by_phase, [*KEYS, "phase"]))


def _by(codes: np.ndarray, n: int) -> pd.Categorical:
    """A grouper of codes 0..n-1 as they are (a categorical's codes: no hash of every record)."""
    return pd.Categorical.from_codes(codes, categories=pd.RangeIndex(n))


def _keyed(key: np.ndarray, modules: pd.Index, ranks: pd.Index) -> pd.DataFrame:
    """module, rank, warm of `of_records`' keys."""
    group = key // 2
    return pd.DataFrame(
        {
            "module": np.asarray(modules, dtype=object)[group // len(ranks)],
            "rank": np.asarray(ranks)[group % len(ranks)],
            "warm": (key % 2).astype(bool),
        }
    )


def _sorted(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return df.sort_values(keys, kind="stable", ignore_index=True)


def merged(parts: list[Sums]) -> Sums:
    """The sums of consecutive windows' parts (a module's steps lie in one window each: they add)."""
    live = [p for p in parts if len(p.modules) or len(p.phases)]
    if len(live) <= 1:
        return live[0] if live else EMPTY
    return Sums(
        _summed([p.modules for p in live], KEYS, _MODULES[3:]),
        _summed([p.phases for p in live], [*KEYS, "phase"], ["dur"]),
    )


def _summed(frames: list[pd.DataFrame], keys: list[str], values: list[str]) -> pd.DataFrame:
    """The `values` of `frames` summed per `keys` (a missing key a key too), sorted by them: as
    `concat(frames).groupby(keys, dropna=False).sum()`, whose float sums (compensated, in row order
    within each key) it makes the same way. Keys are numbered a frame at a time (hash tables of a
    frame's rows, not of all), values summed a column at a time: joining the frames whole and
    grouping them by their keys peaked at 2.7x the parts (+33 MiB for 18 windows' at 256 ranks x
    24 modules)."""
    if any(not len(f) or not f.dtypes.equals(frames[0].dtypes) for f in frames):  # (as concat types them)
        df = pd.concat(frames, ignore_index=True)
        return _sorted(df.groupby(keys, dropna=False, sort=False)[values].sum().reset_index(), keys)
    known = [_union([pd.Index(f[k].unique()) for f in frames]) for k in keys]
    code = []
    for f in frames:  # each row's keys as one number: its keys' places in `known`
        c = np.zeros(len(f), np.int64)
        for k, u in zip(keys, known, strict=True):
            c *= len(u)
            c += u.get_indexer(f[k])
        code.append(c)
    groups = _union([pd.Index(np.unique(c)) for c in code])
    ids = np.concatenate([groups.get_indexer(c) for c in code])
    del code
    by = _by(ids, len(groups))
    out, rest = {}, groups.to_numpy()
    for k, u in reversed(list(zip(keys, known, strict=True))):
        out[k] = u.take(rest % len(u))
        rest = rest // len(u)
    out = {k: out[k] for k in keys}
    for v in values:
        out[v] = (
            pd.concat([f[v] for f in frames], ignore_index=True).groupby(by, observed=False).sum().to_numpy()
        )
    return _sorted(pd.DataFrame(out), keys)


def _union(indexes: list[pd.Index]) -> pd.Index:
    """The distinct values of `indexes` (each of distinct values), in the order they come."""
    out = indexes[0]
    for i in indexes[1:]:
        out = out.append(i[out.get_indexer(i) < 0])
    return out


def chosen(s: Sums) -> Sums:
    """The steady samples' sums (the warm-up's only where a rank has no other), of each module's
    lowest rank that has them."""
    m = s.modules
    if m.empty:
        return s
    steady_rank = (~m["warm"].astype(bool)).groupby(m["rank"]).transform("any")
    return lowest(Sums(m[~(m["warm"].astype(bool) & steady_rank)], s.phases))


def lowest(s: Sums) -> Sums:
    """`s` on each module's lowest rank (under pipeline parallelism a stage's layers run on its
    ranks only: `top_layers`)."""
    m = s.modules[s.modules["module"].notna()]
    m = m[m["rank"] == m.groupby("module")["rank"].transform("min")]
    keys = m[KEYS].assign(warm=m["warm"].astype(bool))
    phases = s.phases.assign(warm=s.phases["warm"].astype(bool)).merge(keys, on=KEYS)
    return Sums(m.reset_index(drop=True), phases)


def table(s: Sums, peak_tflops: float | None, top: int = 10) -> pd.DataFrame:
    """The `top` leaf modules of `s` (`lowest`'s: one rank each) by time per sampled step: forward
    and backward ms, FLOPs, FLOP/s over its own time, MFU, the mean allocated-memory change of its
    forward (CUDA only; None on CPU), and whether its sums are all of warm-up steps (`warmup`)."""
    if s.modules.empty:
        return pd.DataFrame(columns=COLUMNS)
    m = s.modules.assign(module=s.modules["module"].astype(str))
    leaves = leaf_names(m.groupby("module")["flops"].sum())
    leaf = m[m["module"].isin(leaves)]
    ph = s.phases.assign(module=s.phases["module"].astype(str))
    ph = ph[ph["module"].isin(leaves)]
    per = leaf.groupby("module")
    steps = per["steps"].sum().clip(lower=1)
    dur = ph.pivot_table(index="module", columns="phase", values="dur", aggfunc="sum").fillna(0)
    dur = dur.div(steps.reindex(dur.index), axis=0)
    out = pd.DataFrame({"fwd_ms": dur.get("fwd", 0) / 1e6, "bwd_ms": dur.get("bwd", 0) / 1e6})
    out["flops"] = per["flops"].sum() / steps
    secs = (out["fwd_ms"] + out["bwd_ms"]) / 1e3
    out["tflops"] = (out["flops"] / secs.where(secs > 0) / 1e12).where(out["flops"] > 0)
    out["mfu"] = out["tflops"] / peak_tflops if peak_tflops else None
    n = per["mem_n"].sum()
    out["mem_delta"] = per["mem"].sum() / n.where(n > 0)
    out["steps"] = steps.reindex(out.index)
    out["warmup"] = per["warm"].all().astype(bool)
    out = out.assign(_t=out["fwd_ms"] + out["bwd_ms"])
    out = out.sort_values("_t", ascending=False, kind="stable").head(top)  # ties: by name (groupby's order)
    return out.drop(columns="_t").rename_axis("module").reset_index()[COLUMNS]


def leaf_names(flops: pd.Series) -> set[str]:
    """Modules without children (parents' records are inclusive of them), of `flops` (FLOPs per
    module, by name). The root is named by its class, not as a prefix of its children: it is the
    one with the most FLOPs."""
    names = set(flops.index)
    leaves = {n for n in names if not any(o.startswith(n + ".") for o in names)}
    if len(leaves) > 1:
        leaves.discard(str(flops.idxmax()))
    return leaves
