"""Training-log import: a real DeepSpeed log with fp16 overflows, and Megatron lines as printed by
Megatron-LM / Megatron-DeepSpeed (taken from public run logs)."""

from __future__ import annotations

import os

import pytest

from diag.importers.errors import ImportProblem
from diag.importers.logs import import_log
from tests.unit.kineto_samples import GPT_DS

MEGATRON = """\
 [2025-10-06 03:27:07] iteration       10/      20 | consumed samples:         5120 | elapsed time per \
iteration (ms): 4647.8 | throughput per GPU (TFLOP/s/GPU): 151.2 | learning rate: 1.500000E-06 | \
global batch size:   512 | lm loss: 9.763827E+00 | loss scale: 65536.0 | grad norm: 33.055 | \
number of skipped iterations:   0 | number of nan iterations:   0 |
[Rank 0] (after 10 iterations) memory (MB) | allocated: 9554.87939453125 | max allocated: \
12003.60400390625 | reserved: 12232.0 | max reserved: 12232.0
[default7]: iteration 11/ 20 | consumed samples: 384 | consumed tokens: 1.258B | elapsed time per \
iteration (ms): 5350.0 | learning rate: 3.000E-07 | global batch size: 192 | lm loss: 1.119602E+01 | \
loss scale: 32768.0 | grad norm: 18.118 | num zeros: 0.0 | actual seq length: 2048 | number of \
skipped iterations: 1 | number of nan iterations: 0 | samples per second: 35.888 | TFLOPs: 48.77 |
"""


def test_real_deepspeed_log_overflows():
    ranks, frames = import_log(os.path.join(GPT_DS, "train.log"))
    ov = frames["overflow"]
    assert ranks == [0] and len(ov) == 2
    assert list(zip(ov["scale_before"], ov["scale_after"])) == [(256.0, 128.0), (128.0, 64.0)]
    assert ov["step"].is_monotonic_increasing and ov["step"].is_unique


def test_megatron_iteration_and_memory_lines(tmp_path):
    path = tmp_path / "megatron.log"
    path.write_text(MEGATRON)
    _, frames = import_log(str(path))
    steps = frames["log_step"].set_index("step")
    assert steps.loc[10, "iter_ms"] == 4647.8 and steps.loc[10, "tflops"] == 151.2
    assert steps.loc[11, "tflops"] == 48.77 and steps.loc[11, "loss_scale"] == 32768.0
    assert steps.loc[11, "skipped_iters"] == 1 and steps.loc[10, "loss"] == pytest.approx(9.763827)
    mem = frames["memory"].iloc[0]
    assert mem["rank"] == 0 and mem["step"] == 10
    assert mem["peak"] == pytest.approx(12003.60400390625 * 2**20)


@pytest.mark.parametrize("content,reason", [(b"\x00\x01\x02binary" * 50, "binary"),
                                            (b"hello\nworld\n", "no DeepSpeed/Megatron")])
def test_not_a_log(tmp_path, content, reason):
    path = tmp_path / "x.log"
    path.write_bytes(content)
    with pytest.raises(ImportProblem, match=reason):
        import_log(str(path))
