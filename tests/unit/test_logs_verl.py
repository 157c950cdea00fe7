"""Logs diag read only in part before: verl / Ray logs (`(TaskRunner pid=..)` prefixes, ANSI colours,
`step:N - key:value` metric lines), logs pasted as a markdown quote (`> `) and as an indented block.
The fixtures are written for these tests in the formats verl 0.3-0.5 and Ray print."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from diag.importers import detect
from diag.importers.logs import JobFailed, import_log
from diag.importers.logs.lines import Line

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "logs")


def _load(name: str):
    return import_log(os.path.join(FIX, name))


@pytest.mark.parametrize(
    "raw,rank,host,text",
    [
        ("\x1b[36m(TaskRunner pid=2311)\x1b[0m step:1 - a:1", -1, None, "step:1 - a:1"),
        ("(WorkerDict pid=7, ip=10.0.0.12) NCCL version", -1, "10.0.0.12", "NCCL version"),
        ("> (main_task pid=9) epoch 0, step 2", -1, None, "epoch 0, step 2"),
        ("> > [rank3]: RuntimeError: boom", 3, None, "RuntimeError: boom"),
        ("(pid=1986188) WARNING 04-02 cuda.py:22] x", -1, None, "WARNING 04-02 cuda.py:22] x"),
        ("> 5 < 6", -1, None, "5 < 6"),
        ("a > b", -1, None, "a > b"),
    ],
)
def test_quote_ansi_and_ray_prefixes_are_peeled(raw, rank, host, text):
    ln = Line(raw, 1)
    assert (ln.rank, ln.host, ln.text) == (rank, host, text)


def test_verl_metric_lines_behind_coloured_ray_prefixes():
    res = _load("verl_ray_grpo.log")
    steps = res.frames["log_step"].set_index("step")
    assert list(steps.index) == [1, 2, 3, 4, 5, 6]
    assert steps.loc[1, "iter_ms"] == pytest.approx(52310.0)  # timing_s/step, seconds
    assert steps.loc[4, "iter_ms"] == pytest.approx(39775.0)
    assert steps.loc[2, "tokens_per_sec_per_gpu"] == pytest.approx(1850.2)  # perf/throughput
    assert steps.loc[6, "grad_norm"] == pytest.approx(0.366)  # actor/grad_norm
    assert steps.loc[3, "epoch"] == 0.0
    assert steps["loss"].isna().all()  # a policy-gradient loss is no LM loss
    assert res.headers == {} and res.problems == []
    assert detect.kind_of_file(os.path.join(FIX, "verl_ray_grpo.log")) == detect.LOG  # ANSI is not binary


def test_nonfinite_policy_loss_marks_the_step(tmp_path):
    path = tmp_path / "nan.log"
    path.write_text(
        "(TaskRunner pid=1) step:1 - actor/pg_loss:0.010 - timing_s/step:30.0\n"
        "(TaskRunner pid=1) step:2 - actor/pg_loss:nan - timing_s/step:31.0\n"
    )
    steps = import_log(str(path)).frames["log_step"].set_index("step")
    assert steps["loss_nonfinite"].fillna(False).tolist() == [False, True]


def test_markdown_quoted_verl_oom_names_the_step_sizes_and_verls_fix():
    res = _load("verl_oom_markdown_quoted.md")
    assert list(res.frames["log_step"]["step"]) == [1, 2, 3]
    assert res.frames["log_step"].set_index("step").loc[3, "iter_ms"] == pytest.approx(49013.0)
    (problem,) = res.problems
    assert isinstance(problem, JobFailed)
    msg = problem.message
    assert msg.startswith("job failed after step 3 (the last completed): CUDA out of memory")
    assert "tried to allocate 3.50 GiB on GPU 0 (2.25 GiB free of 79.10 GiB)" in msg
    assert "ppo_micro_batch_size_per_gpu" in msg and "--micro-batch-size" not in msg


def test_an_indented_log_block_with_its_traceback():
    res = _load("megatron_indented_crash.rst")
    steps = res.frames["log_step"].set_index("step")
    assert list(steps.index) == [10, 20, 30]
    assert steps.loc[20, "iter_ms"] == pytest.approx(1198.7)
    (problem,) = res.problems
    assert problem.message.startswith(
        "job failed after step 30 (the last completed): RuntimeError (line 11; the log does not name"
    )
    assert "illegal memory access" in problem.message


def test_an_indented_frame_line_is_not_the_exception(tmp_path):
    """The closing line sits at the header's margin: a deeper line naming an error is a frame's code."""
    path = tmp_path / "indented.log"
    path.write_text(
        "    Traceback (most recent call last):\n"
        '      File "x.py", line 1, in <module>\n'
        "        ValueError: not the exception\n"
        "    KeyError: 'lr'\n"
    )
    (problem,) = import_log(str(path)).problems
    assert "KeyError" in problem.message and "line 4" in problem.message


def test_hard_wrapped_metric_lines_read_as_the_unwrapped_ones():
    """The same run as verl_ray_grpo.log with each metric line hard-wrapped at 120 columns, as a
    terminal or a paste leaves it: cut inside keys, inside values, at a separator; the pieces after
    the first carry no Ray prefix."""
    whole, wrapped = _load("verl_ray_grpo.log"), _load("verl_hard_wrapped.log")
    assert len(open(os.path.join(FIX, "verl_hard_wrapped.log")).read().splitlines()) > 40  # wrapped
    pd.testing.assert_frame_equal(wrapped.frames["log_step"], whole.frames["log_step"])
    assert wrapped.frames["log_step"].set_index("step").loc[1, "tokens_per_sec_per_gpu"] == 1421.7


_FIRST = (
    "(TaskRunner pid=1) step:1 - actor/pg_loss:0.010 - actor/grad_norm:0.311 - actor/lr:0.000 - "
    "timing_s/step:30.5 - perf/throughput:14"
)


@pytest.mark.parametrize(
    "after,throughput",
    [
        ("21.7", 1421.7),  # a value cut: the piece's first fragment has no `:`
        ("21.7 - training/epoch:0.000", 1421.7),
        ("(TaskRunner pid=1) 21.7", 14.0),  # a prefix of its own: a line of its own
        ("21.7" + " " * len(_FIRST), 14.0),  # wider than the first line: no piece of it
        ("21.7 - done", 14.0),  # `done` is no `key:number` field
        ("  21.7", 14.0),  # indented: no wrapped piece starts with blanks
    ],
)
def test_a_piece_continues_a_metric_line_only_when_unambiguous(tmp_path, after, throughput):
    path = tmp_path / "wrap.log"
    path.write_text(_FIRST + "\n" + after + "\n(TaskRunner pid=1) epoch 0, step 2\n")
    steps = import_log(str(path)).frames["log_step"].set_index("step")
    assert steps.loc[1, "tokens_per_sec_per_gpu"] == throughput
    assert steps.loc[1, "iter_ms"] == 30500.0


def test_a_complete_field_then_a_field_of_its_own_is_no_piece(tmp_path):
    """After a line that ends with a whole field, a line starting with a field (`gen:1`) may be a line
    of its own: not joined (joined it would read as the last field's value `1.0gen:1`, or a new key)."""
    path = tmp_path / "wrap.log"
    path.write_text(_FIRST.replace(":14", ":1421.7") + "\ngen:1 - x:2\n")
    steps = import_log(str(path)).frames["log_step"].set_index("step")
    assert steps.loc[1, "tokens_per_sec_per_gpu"] == 1421.7


def test_a_short_metric_line_is_never_wrapped(tmp_path):
    path = tmp_path / "short.log"
    path.write_text("step:1 - timing_s/step:3\n0.5 - perf/throughput:1.0\n")
    steps = import_log(str(path)).frames["log_step"].set_index("step")
    assert steps.loc[1, "iter_ms"] == 3000.0


def test_the_world_size_from_verls_trainer_config():
    """PPO's pretty-printed config: trainer.nnodes x trainer.n_gpus_per_node GPUs (2 x 8); the
    reward_model section's keys of the same names (0 and 0, a pool of its own) do not count."""
    res = _load("verl_ppo_config.log")
    assert res.ranks == list(range(16))
    assert {h["world_size"] for h in res.headers.values()} == {16}
    assert list(res.frames["log_step"]["step"]) == [1, 2]


def test_the_world_size_from_verls_one_line_config(tmp_path):
    """The SFT trainer prints its config on one line; `trainer` is not its last section here."""
    path = tmp_path / "sft.log"
    path.write_text(
        "{'data': {'train_batch_size': 256}, 'trainer': {'project_name': 'sft', 'nnodes': 1, "
        "'n_gpus_per_node': 4, 'checkpoint': {'load_contents': '${trainer.checkpoint.save_contents}'}}, "
        "'reward_model': {'nnodes': 3, 'n_gpus_per_node': 8}}\n"
        "step:1 - train/loss:1.2 - train/lr(1e-3):0.01\n"
    )
    res = import_log(str(path))
    assert res.headers[0]["world_size"] == 4 and res.ranks == [0, 1, 2, 3]


def test_a_config_without_the_trainer_counts_says_no_world_size(tmp_path):
    path = tmp_path / "half.log"
    path.write_text("{'trainer': {'n_gpus_per_node': 8, 'project_name': 'x'}}\nstep:1 - timing_s/step:3.0\n")
    assert "world_size" not in import_log(str(path)).headers.get(0, {})
