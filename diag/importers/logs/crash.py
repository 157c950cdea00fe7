"""Failed ranks, from the log alone, and the one statement that says what happened.

Signs read (each with the rank its prefix or text names):
- a Python traceback's (or rich's boxed traceback's) closing `ExcType: message` line (`RuntimeError`,
  `torch.OutOfMemoryError`, `torch.distributed.DistBackendError`, ...); `CUDA out of memory` (tried /
  free / capacity, both the pre-2.1 and the current wording) makes it an OOM;
- torch's NCCL watchdog: `[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5,
  OpType=ALLREDUCE, NumelIn=..., NumelOut=..., Timeout(ms)=600000) ran for 600081 milliseconds`;
- launchers' exit codes: torchrun's `ChildFailedError` report (`rank : 1 (local_rank: 1)` /
  `exitcode : -9`), `failed (exitcode: -9) local_rank: 0 (pid: ...)`, DeepSpeed's launcher
  `[... '--local_rank=3', ...] exits with return code = -9`; `Segmentation fault`, `terminate called`.
A traceback the job survived (progress lines after it, and no launcher failure) is not a crash.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from diag.importers.logs.lines import Line, num
from diag.importers.logs.records import Failure, Records
from diag.vocab import STOP_SIGNALS

_EXC = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Failure|Timeout))"
    r"(?::\s*(.*))?$"
)
_SIZE = r"([\d.]+ [KMGT]?i?B)"
_OOM_NEW = re.compile(
    r"Tried to allocate "
    + _SIZE
    + r"\. GPU (\d+) has a total capacity of "
    + _SIZE
    + r" of which ([\d.]+ [KMGT]?i?B) is free"
)
_OOM_OLD = re.compile(
    r"Tried to allocate "
    + _SIZE
    + r" \(GPU (\d+); "
    + _SIZE
    + " total capacity; "
    + _SIZE
    + r" already allocated; "
    + _SIZE
    + " free"
)
_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)"
    r"(?:, NumelIn=(\d+), NumelOut=(\d+))?.*?Timeout\(ms\)=(\d+)\)"
    r"(?: ran for (\d+) milliseconds)?"
)
_TORCHRUN = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: \d+\)")
_DS_EXIT = re.compile(r"exits with return code = (-?\d+)")
_LOCAL = re.compile(r"--local_rank=(\d+)")
_CHILD = re.compile(r"^\s*(time|rank|exitcode|host|traceback)\s*:\s*(.*)$")
_RICH_TB = "Traceback (most recent call last)"  # rich's boxed traceback: `╭─── Traceback (...) ───╮`
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


class CrashReader:
    def __init__(self, rec: Records) -> None:
        self.rec = rec
        self.open_tb: dict[int, int] = {}  # rank -> line of its open `Traceback` header
        self.margin: dict[int, int] = {}  # rank -> blanks before its `Traceback` header
        self.child: dict[str, Any] | None = None  # the ChildFailedError entry being read

    def line(self, ln: Line) -> bool:
        t = ln.text
        s = t.lstrip() if t[:1].isspace() else t  # a log pasted as an indented block: its own margin
        if s.startswith("Traceback (most recent call last)") or (s.startswith("╭") and _RICH_TB in s):
            self.open_tb[ln.rank] = ln.no
            self.margin[ln.rank] = len(t) - len(s)
            return True
        if "ChildFailedError" in t and not t[:1].isspace():  # torchrun's report of its ranks' exit codes
            self.open_tb.pop(ln.rank, None)
            self.child = {}
            return True
        if self.open_tb and self._tb_open(ln.rank) and (m := self._exc_line(ln.rank, t)):
            self.open_tb.pop(ln.rank, None) if ln.rank in self.open_tb else self.open_tb.pop(-1, None)
            self._exception(ln, m.group(1), m.group(2) or "")
            return True
        if "Watchdog caught" in t and (m := _WATCHDOG.search(t)):
            self._add(
                ln,
                "nccl_timeout",
                "NCCL timeout",
                t[m.start() :],
                seq=int(m.group(1)),
                op=m.group(2),
                numel_in=_i(m.group(3)),
                numel_out=_i(m.group(4)),
                timeout_ms=_i(m.group(5)),
                ran_ms=_i(m.group(6)),
            )
            return True
        if self.child is not None:
            return self._child(ln, t)
        if "exitcode:" in t and (m := _TORCHRUN.search(t)):
            self._exit(ln, int(m.group(1)), int(m.group(2)), local=True)
            return True
        if "exits with return code" in t and (m := _DS_EXIT.search(t)):
            local = _LOCAL.search(t)
            rank = int(local.group(1)) if local else ln.rank
            on_host = self.rec.host_ranks.get(ln.host or "")
            if local and on_host and rank < len(on_host):  # --local_rank is per node
                rank = on_host[rank]
            self._exit(ln, int(m.group(1)), rank)
            return True
        if "Segmentation fault" in t or t.startswith("terminate called after throwing"):
            self._add(ln, "exception", "abort", t.strip())
            return True
        return False

    def _exc_line(self, rank: int, t: str) -> re.Match[str] | None:
        """The traceback's closing `ExcType: message`: at the traceback header's own margin (its frames
        are indented further)."""
        margin = self.margin.get(rank if rank in self.open_tb else -1, 0)
        if (margin and not t[:margin].isspace()) or t[margin : margin + 1].isspace():
            return None
        return _EXC.match(t.strip())

    def _tb_open(self, rank: int) -> bool:
        return rank in self.open_tb or -1 in self.open_tb

    def _exception(self, ln: Line, exc: str, msg: str) -> None:
        name = exc.rsplit(".", 1)[-1]
        if "out of memory" in msg or name == "OutOfMemoryError":
            m = _OOM_NEW.search(msg)
            detail: dict[str, Any] = {}
            if m:
                detail = {
                    "tried": m.group(1),
                    "gpu": int(m.group(2)),
                    "capacity": m.group(3),
                    "free": m.group(4),
                }
            if not m and (o := _OOM_OLD.search(msg)):
                detail = {
                    "tried": o.group(1),
                    "gpu": int(o.group(2)),
                    "capacity": o.group(3),
                    "allocated": o.group(4),
                    "free": o.group(5),
                }
            self._add(ln, "oom", exc, msg, **detail)
        elif name in ("KeyboardInterrupt", "SignalException"):  # torchrun's, when it is sent SIGTERM
            self._add(ln, "interrupted", exc, msg)
        else:
            self._add(ln, "exception", exc, msg)

    def _child(self, ln: Line, t: str) -> bool:
        m = _CHILD.match(t)
        if m is None:
            if t.strip().startswith("Root Cause"):  # torchrun: "Root Cause (first observed failure):"
                self.child["root_next"] = True  # type: ignore[index]
            elif t.strip().startswith("=====") and self.child.get("rank") is not None:  # type: ignore[union-attr]
                self.child = None
            return True
        key, value = m.group(1), m.group(2)
        entry = self.child
        assert entry is not None
        if key == "time":  # each entry starts with its time
            root = entry.get("root_next", False)
            entry.clear()
            entry["root"] = root
        elif key == "rank":
            entry["rank"] = _i(value.split()[0])
        elif key == "host":
            entry["host"] = value.strip()
        elif key == "exitcode":
            entry["code"] = _i(value.split()[0])
            if entry.get("rank") is not None and entry["code"] is not None:
                if entry.get("host"):
                    self.rec.hosts.setdefault(entry["rank"], entry["host"])
                self._exit(ln, entry["code"], entry["rank"], root=bool(entry.get("root")))
        return True

    def _exit(self, ln: Line, code: int, rank: int, local: bool = False, root: bool = False) -> None:
        if code == 0:
            return
        sig = _SIGNALS.get(-code) if code < 0 else None
        kind = "interrupted" if sig == "SIGINT" else "exit"
        text = f"exit code {code}" + (f" ({sig})" if sig else "")
        detail = {"code": code, "signal": sig, "local": local, "root": root}
        self.rec.failures.append(Failure(kind, rank, ln.no, ln.ts, "exit", text, detail, ln.raw[:300]))

    def _add(self, ln: Line, kind: str, exc: str, msg: str, **detail: Any) -> None:
        self.rec.failures.append(
            Failure(kind, ln.rank, ln.no, ln.ts, exc, msg.strip()[:300], detail, ln.raw[:300])
        )


def _i(text: str | None) -> int | None:
    v = num(text)
    return None if v is None or v != v else int(v)


_PRIORITY = {"oom": 0, "nccl_timeout": 1, "exception": 2, "interrupted": 3, "exit": 4}
_FIXES = {
    "megatron": "lower --micro-batch-size, add --recompute-activations, or raise --tensor-model-parallel-size"
    " / --pipeline-model-parallel-size",
    "deepspeed": "lower train_micro_batch_size_per_gpu (raise gradient_accumulation_steps to keep the batch),"
    " raise zero_optimization.stage, or enable activation_checkpointing",
    "verl": "lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (and the ref/rollout"
    " log_prob_micro_batch_size_per_gpu), set actor_rollout_ref.model.enable_gradient_checkpointing=True,"
    " actor_rollout_ref.actor.fsdp_config.param_offload/optimizer_offload=True, or lower"
    " actor_rollout_ref.rollout.gpu_memory_utilization",
    "hf": "lower per_device_train_batch_size (raise gradient_accumulation_steps to keep the batch) or set"
    " gradient_checkpointing=True",
    "neox": "lower train_micro_batch_size_per_gpu (raise gradient_accumulation_steps to keep the batch), set"
    " checkpoint_activations: true, or raise model_parallel_size / pipe_parallel_size in the NeoX config",
    "torchtitan": "lower the per-rank batch or sequence length ([training] local_batch_size / seq_len;"
    " num_tokens_per_microbatch_per_dp_rank in 2026 releases), turn on full activation checkpointing, or"
    " shard over more GPUs (tensor_parallel_degree, data_parallel_shard_degree)",
    "nanogpt": "lower batch_size (raise gradient_accumulation_steps to keep the batch) or block_size",
    # no family known: no framework's knob names
    "": "lower the per-GPU batch size (more gradient accumulation keeps the batch), turn on activation"
    " checkpointing, or shard the model over more GPUs",
}


def ranks_text(ranks: list[int]) -> str:
    """`0-3, 7` for [0, 1, 2, 3, 7]; `?` stands for lines that name no rank."""
    known = sorted({r for r in ranks if r >= 0})
    parts: list[str] = []
    for r in known:
        if parts and parts[-1][1] == r - 1:
            parts[-1] = (parts[-1][0], r)
        else:
            parts.append((r, r))  # type: ignore[arg-type]
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)  # type: ignore[misc]
    return text if not any(r < 0 for r in ranks) else (text + ", ?" if text else "?")


def evidence(rec: Records) -> tuple[list[Failure], list[Failure]]:
    """(causes, launcher exits) of a failed job; both empty when the job did not fail. In a job of one
    process (world size 1) a sign that names no rank is rank 0's: a single-GPU run's traceback has no
    `[rankN]:` prefix, and torchrun's report of its exit names rank 0 as the root cause."""
    if rec.layout.get("world_size") == 1:
        for f in rec.failures:
            if f.rank < 0:
                f.rank = 0
    exits = [f for f in rec.failures if f.exc == "exit"]
    if any(not f.detail.get("local") for f in exits):  # torchrun's `local_rank:` is per node: the
        exits = [f for f in exits if not f.detail.get("local")]  # report's global ranks say more
    late = [f for f in rec.failures if f.exc != "exit" and f.line > rec.last_step_line]
    return late or ([f for f in rec.failures if f.exc != "exit"] if exits else []), exits


FAILURE_COLUMNS = [
    "rank",
    "step",
    "ts",
    "line",
    "kind",
    "exc",
    "message",
    "seq",
    "op",
    "code",
    "signal",
    "text",
    "first",
    "statement",
    "fix",
    "path",
    "steps_known",
]


def failure_frame(rec: Records, path: str = "") -> pd.DataFrame:
    """`log_failure`: one row per sign of the failure (for rules), the last completed step on each;
    `first` marks the one the statement (`statement`, on that row) names, `text` is the line itself."""
    causes, exits = evidence(rec)
    chosen = _choose(causes, exits)
    said = verdict(rec)
    return pd.DataFrame(
        [
            {
                "rank": f.rank,
                "step": rec.last_step,
                "ts": f.ts,
                "line": f.line,
                "kind": f.kind,
                "exc": f.exc,
                "message": f.message,
                **{k: v for k, v in f.detail.items() if k in ("seq", "op", "code", "signal")},
                "text": f.text,
                "first": f is chosen,
                "steps_known": bool(rec.last_step or rec.families),  # else "before step 1" is a guess
                "path": path,
                "statement": said[1] if said and f is chosen else None,
                "fix": oom_fix(rec) if f is chosen and f.kind == "oom" else None,
            }
            for f in causes + exits
        ],
        columns=FAILURE_COLUMNS,
    )


def _choose(causes: list[Failure], exits: list[Failure]) -> Failure | None:
    """The failure the statement leads with: the most telling kind, first in time; where torchrun
    names the root cause (its first observed failure), that rank's own cause, else its exit: the
    others' errors then are consequences (a peer killed by SIGKILL leaves the survivors raising
    "Connection reset by peer", and they raise first)."""
    root = {f.rank for f in exits if f.detail.get("root")}
    if root:
        own = [f for f in causes if f.rank in root]
        pool = own or [f for f in exits if f.rank in root]
        best = min(_PRIORITY[f.kind] for f in pool)
        return min(
            (f for f in pool if _PRIORITY[f.kind] == best), key=lambda f: (f.ts is None, f.ts or 0, f.line)
        )
    pool = causes or exits
    if not pool:
        return None
    best = min(_PRIORITY[f.kind] for f in pool)
    main = [f for f in pool if _PRIORITY[f.kind] == best]
    return min(main, key=lambda f: (f.ts is None, f.ts or 0, f.line))


def stopped_from_outside(fails: list[Failure]) -> bool:
    """Every sign is an interrupt (KeyboardInterrupt, torchrun's SignalException) or an exit by a
    stop signal: the job was stopped (Ctrl-C, scancel, a time limit), it did not fail by itself."""
    return bool(fails) and all(
        f.kind == "interrupted" or (f.kind == "exit" and f.detail.get("signal") in STOP_SIGNALS)
        for f in fails
    )


def verdict(rec: Records) -> tuple[int, str] | None:
    """(line, one-line statement) when the log shows the job failed; None when it did not (nor when
    it was only stopped from outside: job_crash says so, as info)."""
    causes, exits = evidence(rec)
    first = _choose(causes, exits)
    if first is None or stopped_from_outside(causes + exits):
        return None
    pool = (causes or exits) if first in (causes or exits) else exits
    main = [f for f in pool if _PRIORITY[f.kind] == _PRIORITY[first.kind]]
    when = (
        f"after step {rec.last_step} (the last completed)"
        if rec.last_step
        else "before step 1"
        if rec.families
        else "(the log has no progress line diag reads: the step is unknown)"
    )
    what = {
        "oom": "CUDA out of memory",
        "nccl_timeout": "NCCL collective timeout",
        "interrupted": "interrupted",
    }.get(first.kind, first.exc)
    if first.exc == "exit":
        what = f"process ended with {first.message}"
    head = f"job failed {when}: {what}"
    same = [f for f in main if (f.exc, f.kind) == (first.exc, first.kind)]
    if first.exc == "exit":  # ranks that ended the same way (a SIGTERMed survivor is not a SIGKILLed one)
        same = [f for f in same if f.message == first.message]
    named = ranks_text([f.rank for f in same])
    who = (
        f" on rank(s) {named} (first: rank {_r(first.rank)}, line {first.line})"
        if named != "?"
        else f" (line {first.line}; the log does not name the rank)"
    )
    body = " (torchrun's root cause, its first observed failure)" if first.detail.get("root") else ""
    body += _detail(first, same, rec)
    if exits and first.exc != "exit":
        codes = sorted({f.message for f in exits})
        body += f"; launcher: rank(s) {ranks_text([f.rank for f in exits])} ended with {', '.join(codes)}"
    if first.detail.get("root"):
        then = [f for f in causes if f.rank != first.rank]
        if then:
            t = then[0]
            body += f"; then rank(s) {ranks_text([f.rank for f in then])} raised {t.exc}: {t.message[:120]}"
    return first.line, head + who + body


def _r(rank: int) -> str:
    return str(rank) if rank >= 0 else "?"


def oom_fix(rec: Records) -> str:
    """The OOM fix in the job's own framework's terms."""
    order = ("neox", "torchtitan", "nanogpt", "megatron", "verl", "hf", "deepspeed")  # neox: megatron's too
    family = next((f for f in order if f in rec.families), "")
    return _FIXES[family]


def _detail(first: Failure, same: list[Failure], rec: Records) -> str:
    d = first.detail
    if first.kind == "oom":
        mem = (
            f": tried to allocate {d['tried']} on GPU {d['gpu']} ({d['free']} free of {d['capacity']})"
            if d.get("tried")
            else f": {first.message[:160]}"
        )
        return mem + f"; fix: {oom_fix(rec)}"
    if first.kind == "nccl_timeout":
        by_seq: dict[tuple[Any, Any], list[int]] = {}
        for f in same:
            by_seq.setdefault((f.detail.get("seq"), f.detail.get("op")), []).append(f.rank)
        parts = [
            f"{op} SeqNum={seq} on rank(s) {ranks_text(rs)}"
            for (seq, op), rs in sorted(by_seq.items(), key=lambda kv: -len(kv[1]))
        ]
        text = f": {parts[0]} (timeout {d.get('timeout_ms')} ms)"
        if len(parts) > 1:
            text += "; desync: " + "; ".join(parts[1:]) + " differ"
        return text
    if first.exc == "exit":
        return (
            "; killed: often the host's OOM killer or the scheduler" if d.get("signal") == "SIGKILL" else ""
        )
    return f": {first.message[:200]}" if first.message else ""
