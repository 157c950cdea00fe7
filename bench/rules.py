"""The labeled evaluation of the rules: precision and recall per rule over every labeled trace.

    python -m bench.rules [FOLDER ...]

Each folder (default: every `sample_traces/*/` with a `labels.toml`) holds one run and its labels:
`must_flag` (rules that must report it), `must_not_flag` (rules that must stay silent; `"*"` is every
rule not otherwise listed) and `known_misses` ({rule: why}: a must-flag diag does not yet meet, counted
as a miss here, excused by the test). A finding of a must-not rule is a false alarm; a rule in neither
list is not scored. `[severity]` ({rule: "info" | "warning" | "critical"}) is the severity a flagged
rule's finding must carry (severity follows the share of time it costs: diag.findings.severity_of).
Every fix of every finding is also checked: Megatron arguments against the job's framework's parser
(analyzers/knob_table.py, at the job's version, as are ds_config keys) and ds_config patches against the
installed DeepSpeed's config classes (when it is installed).
"""

from __future__ import annotations

import argparse
import copy
import glob
import os
from dataclasses import dataclass, field
from typing import Any

import tomllib

LABELS = "labels.toml"  # TOML: a .json file in a trace folder would be read as a Kineto trace
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Scored:
    folder: str
    flagged: set[str]
    must: set[str]
    must_not: set[str]
    excused: dict[str, str]
    bad_fixes: list[str] = field(default_factory=list)
    severities: dict[str, str] = field(default_factory=dict)
    expected_severity: dict[str, str] = field(default_factory=dict)

    @property
    def wrong_severity(self) -> dict[str, tuple[str, str | None]]:
        """{rule: (expected, got)} where a labeled rule's finding carries another severity."""
        return {
            r: (want, self.severities.get(r))
            for r, want in self.expected_severity.items()
            if self.severities.get(r) != want
        }

    @property
    def false_alarms(self) -> set[str]:
        return self.flagged & self.must_not

    @property
    def misses(self) -> set[str]:
        return self.must - self.flagged


def labeled(paths: list[str] | None = None) -> list[str]:
    if paths:
        return paths
    found = glob.glob(os.path.join(ROOT, "sample_traces", "*", LABELS))
    return sorted(os.path.dirname(p) for p in found)


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = _merge(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


def fix_problems(trace: Any, findings: list[Any]) -> list[str]:
    """Fixes not applicable as written: a flag the job's framework lacks, a ds_config patch for a job
    DeepSpeed does not run, or one the installed DeepSpeed rejects."""
    from diag.analyzers import framework, knob_table

    job = framework.detect(trace)
    table = knob_table.ARGS.get(job.framework, frozenset())
    out = []
    for f in findings:
        for fix in f.fixes:
            out += [
                f"{f.rule}: {a} is no {job.framework} argument"
                for a in fix.megatron_args
                if a.startswith("--") and a not in table
            ]
            if not job.applicable(fix):
                at = f"{job.framework} {job.version or ''}".strip()
                out.append(f"{f.rule}: {fix.summary!r} names a knob {at} lacks")
            if fix.ds_config is None:
                continue
            if job.deepspeed is False:
                out.append(f"{f.rule}: ds_config patch for a {job.framework} job")
                continue
            try:
                from deepspeed.runtime.config import DeepSpeedConfig
            except ImportError:
                continue
            base = {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 1,
                **{k: v for k, v in job.ds_config.items() if k != "train_batch_size"},
            }
            try:
                DeepSpeedConfig(_merge(base, fix.ds_config))
            except Exception as exc:  # noqa: BLE001 - any rejection is the finding
                out.append(f"{f.rule}: DeepSpeed rejects {fix.ds_config}: {str(exc).splitlines()[0][:120]}")
    return out


def score(folder: str, rules: list[str]) -> Scored:
    from diag.analyzers import run_all

    from diag.importers import load_inputs

    with open(os.path.join(folder, LABELS), "rb") as f:
        labels = tomllib.load(f)
    excused = dict(labels.get("known_misses") or {})
    must = set(labels.get("must_flag") or []) | set(excused)
    must_not = set(labels.get("must_not_flag") or [])
    if "*" in must_not:
        must_not = (must_not - {"*"}) | (set(rules) - must)
    # `inputs`: the files of the folder to score, where it holds more than one capture (runs are never
    # merged: kineto_gloo_dp keeps the CPU capture and its GPU-shaped twin side by side)
    trace = load_inputs([os.path.join(folder, p) for p in labels.get("inputs") or []] or [folder])
    findings, failures = run_all(trace)
    if failures:
        raise RuntimeError(f"{folder}: rules failed: {failures}")
    return Scored(
        os.path.relpath(folder, ROOT),
        {f.rule for f in findings},
        must,
        must_not,
        excused,
        fix_problems(trace, findings),
        _worst_severity(findings),
        dict(labels.get("severity") or {}),
    )


def _worst_severity(findings: list[Any]) -> dict[str, str]:
    from diag.findings import SEVERITIES

    out: dict[str, str] = {}
    for f in findings:
        if SEVERITIES.index(f.severity) >= SEVERITIES.index(out.get(f.rule, "info")):
            out[f.rule] = f.severity
    return out


Row = tuple[str, int, int, int, float | None, float | None]


def table(scored: list[Scored], rules: list[str]) -> list[Row]:
    """Per rule: true positives, false alarms, misses, precision, recall (None: nothing to divide)."""
    rows = []
    for rule in rules:
        tp = sum(rule in s.flagged and rule in s.must for s in scored)
        fp = sum(rule in s.false_alarms for s in scored)
        fn = sum(rule in s.misses for s in scored)
        rows.append(
            (rule, tp, fp, fn, tp / (tp + fp) if tp + fp else None, tp / (tp + fn) if tp + fn else None)
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="precision and recall of every rule on labeled traces")
    ap.add_argument("folders", nargs="*", help="labeled trace folders (default: sample_traces/*/labels.toml)")
    a = ap.parse_args(argv)
    from diag.analyzers import registered_rules

    rules = sorted(registered_rules())
    scored = [score(f, rules) for f in labeled(a.folders)]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    print(f"{len(scored)} labeled traces\n")
    print(f"{'rule':22s} {'TP':>3s} {'FP':>3s} {'FN':>3s} {'precision':>9s} {'recall':>6s}")
    for rule, tp, fp, fn, p, r in table(scored, rules):
        print(f"{rule:22s} {tp:3d} {fp:3d} {fn:3d} {fmt(p):>9s} {fmt(r):>6s}")
    print()
    for s in scored:
        notes = [f"false alarm: {', '.join(sorted(s.false_alarms))}"] if s.false_alarms else []
        notes += [f"missed: {r}" + (f" ({s.excused[r]})" if r in s.excused else "") for r in sorted(s.misses)]
        notes += [f"fix: {b}" for b in s.bad_fixes]
        notes += [f"severity of {r}: {got} (labeled {want})" for r, (want, got) in s.wrong_severity.items()]
        got = [f"{r} ({s.severities[r]})" for r in sorted(s.flagged)]
        print(f"{s.folder}: flagged {got or 'nothing'}" + "".join(f"\n    {n}" for n in notes))
    bad = sum(
        len(s.false_alarms) + len(s.misses - set(s.excused)) + len(s.bad_fixes) + len(s.wrong_severity)
        for s in scored
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
