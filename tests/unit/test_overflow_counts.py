"""Overflow and skipped-iteration counts per step: 2 ranks skipping 5 steps are 5 overflows (not 10),
a trace plus its log are counted once (not 15), and a job that skipped every logged iteration is
reported (not "0 overflows, no finding")."""

from __future__ import annotations

from diag import schema
from diag.importers import load_inputs
from diag.metrics.stage import Metrics
from diag.report import model
from tests.unit.synth_trace import MS, Job, fired

FP16 = {"zero_stage": 1, "dtype": "fp16"}
SKIPPED = (2, 4, 6, 8, 10)


def _trace_dir(path) -> str:
    job = Job(steps=12, header=FP16)
    for r in range(job.ranks):
        for s in range(12):
            hit = s in SKIPPED
            job.add(
                r,
                schema.OVERFLOW,
                step=s,
                ts=job.start(r, s) + 90 * MS,
                overflow=hit,
                scale_before=1024.0,
                scale_after=512.0 if hit else 1024.0,
                skipped_steps=0,
                source="update_scale",
            )
    job.write(str(path))
    return str(path)


def _megatron_log(path, skipped: set[int], n: int = 12) -> str:
    """Megatron's per-iteration line (`number of skipped iterations` since the previous line)."""
    lines = [
        f" iteration {i:8d}/ {n:8d} | consumed samples: {i * 8:12d} | elapsed time per iteration "
        f"(ms): 150.2 | learning rate: 1.000E-04 | global batch size:     8 | loss scale: 1024.0 | "
        f"number of skipped iterations: {int(i in skipped):3d} | number of nan iterations:   0 |"
        for i in range(1, n + 1)
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _summary(paths: list[str]) -> dict:
    trace = load_inputs(paths)
    return model.build(trace, [], {}, Metrics(trace))["summary"]


def test_overflows_counted_per_step_not_per_rank_step(tmp_path):
    assert _summary([_trace_dir(tmp_path / "t")])["overflows"] == len(SKIPPED)


def test_trace_and_its_log_counted_once(tmp_path):
    log = _megatron_log(tmp_path / "train.log", set(SKIPPED))
    assert _summary([log])["overflows"] == len(SKIPPED)
    assert _summary([_trace_dir(tmp_path / "t"), log])["overflows"] == len(SKIPPED)


def test_every_logged_iteration_skipped_is_reported(tmp_path):
    """BigScience-like: 80 iterations logged, every one skipped."""
    log = _megatron_log(tmp_path / "train.log", set(range(1, 81)), n=80)
    trace = load_inputs([log])
    summary = model.build(trace, [], {}, Metrics(trace))["summary"]
    assert summary["overflows"] == 80
    (f,) = fired(trace, "overflow_storm")
    assert f.severity == "critical" and "every step" in f.title and f.evidence["overflow_steps"] == 80


def test_calibration_or_a_few_skips_in_a_log_are_not_every_step(tmp_path):
    """A log lists only the skipped iterations among its overflow rows: 2 skips of 12 iterations,
    or 12 skipped of 12 (a calibration), are not "every step skipped"."""
    for n, skipped in ((12, {2, 3}), (12, set(range(1, 13)))):
        trace = load_inputs([_megatron_log(tmp_path / f"t{len(skipped)}.log", skipped, n=n)])
        assert [f for f in fired(trace, "overflow_storm") if "every step" in f.title] == []


MDS_LINE = (
    " iteration {i:8d}/      40 | consumed samples:            {s} | elapsed time per iteration (ms): 352.1 |"
    " learning rate: 1.000E-04 | global batch size:     2 | loss scale: {scale:.1f} | actual seqlen:    64 |"
    " number of skipped iterations:   {k} | number of nan iterations:   0 | TFLOPs: 0.00 |\n"
)


def test_counted_overflows_take_their_loss_scale_from_the_iteration_lines(tmp_path):
    """Megatron-DeepSpeed prints no overflow line, only `number of skipped iterations` and the loss
    scale after each iteration's update: a skipped iteration's scale is `previous -> its own`, and
    its rank (none printed) shows as '-', not -1 (the real pretrain_gpt.py log read '-1 | ? -> ?')."""
    log = tmp_path / "mds.log"
    scales = [2.0**30, 2.0**29, 2.0**28, 2.0**28]
    log.write_text(
        "".join(MDS_LINE.format(i=i + 1, s=2 * i + 2, scale=sc, k=int(i < 3)) for i, sc in enumerate(scales))
    )
    doc = model.build(load_inputs([str(log)]), [], {})
    got = [(r["step"], r["scale_before"], r["scale_after"]) for r in doc["overflows"]]
    assert got == [(1, None, 2.0**30), (2, 2.0**30, 2.0**29), (3, 2.0**29, 2.0**28)]
    from diag.report.trace_tables import overflow_table

    ((_, _, rows),) = overflow_table(doc)
    assert rows[1][:3] == ["-", "2", "1.07374e+09 -> 5.36871e+08"]
