"""The fast log reading (`logs.prefilter`: binary chunks, keyword prefilter, remembered prefix parses; and
`logs.many`: several logs in worker processes, steps merged as they come) reads exactly what offering
every line to the readers reads, on every fixture and on the awkward cases of a real file."""

from __future__ import annotations

import glob
import gzip
import os

import pandas as pd
import pytest

from diag.importers.errors import ImportProblem
from diag.importers.logs import import_log, merge_parts, prefilter
from diag.importers.logs.lines import Line, peel
from diag.importers.logs.many import import_logs

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FIX = os.path.join(ROOT, "tests", "fixtures", "logs")
LOGS = sorted(
    glob.glob(os.path.join(FIX, "*.log"))
    + glob.glob(os.path.join(FIX, "*.md"))
    + glob.glob(os.path.join(FIX, "*.rst"))
    + glob.glob(os.path.join(ROOT, "sample_traces", "*", "*.log"))
)


def _same(path: str) -> None:
    def read(every: bool):
        try:
            return import_log(path, every_line=every)
        except ImportProblem as e:
            return str(e)

    fast, every = read(False), read(True)
    if isinstance(every, str) or isinstance(fast, str):
        assert fast == every
        return
    assert fast.ranks == every.ranks
    assert fast.headers == every.headers
    assert [(p.path, p.message) for p in fast.problems] == [(p.path, p.message) for p in every.problems]
    assert fast.frames.keys() == every.frames.keys()
    for kind in every.frames:
        pd.testing.assert_frame_equal(fast.frames[kind], every.frames[kind])


def test_there_are_fixtures():
    assert len(LOGS) >= 20


@pytest.mark.parametrize("path", LOGS, ids=os.path.basename)
def test_the_prefilter_reads_what_every_line_reads(path):
    _same(path)


def _awkward(tmp_path) -> str:
    """Every fixture's lines in one file, with what real files do to them: CRLF endings, a progress bar
    rewritten with `\\r`, bytes that are no UTF-8, a blank and a tab in the launcher prefixes, a line
    past the line limit, and no newline at the end."""
    lines = []
    for k, path in enumerate(LOGS):
        for i, ln in enumerate(open(path, encoding="utf-8").read().splitlines()):
            if k % 3 == 1:
                ln = f"worker-{k}: [rank{i % 4}]:\t{ln}"
            elif k % 3 == 2:
                ln = f"{i % 5}: {ln}"
            lines.append(ln.encode())
    lines[5] += b"\r\n"
    lines[40] = (
        b"  5%|5         | 1/20 [00:01<00:19,  1.00s/it]\r 10%|#         | 2/20 [00:02<00:18,  1.00s/it]"
    )
    lines[41] = b"[rank1]: bad \xff\xfe bytes iteration 3/ 10 | lm loss: 2.0 |"
    lines[60] = b"[rank7]: " + b"x" * 3000 + b" iteration"
    data = b"\n".join(lines)
    path = tmp_path / "awkward.log"
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("chunk", [64, 1000, prefilter.CHUNK])
def test_awkward_lines_and_chunk_edges_read_the_same(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(prefilter, "CHUNK", chunk)
    monkeypatch.setenv("DIAG_MAX_LINE_BYTES", "2000")  # line 61 is past it: dropped by both
    path = _awkward(tmp_path)
    _same(path)
    gz = tmp_path / "awkward.log.gz"
    gz.write_bytes(gzip.compress(open(path, "rb").read()))
    _same(str(gz))


def test_ranks_named_only_by_lines_no_reader_reads_are_counted(tmp_path):
    path = tmp_path / "chatter.log"
    path.write_bytes(
        b"worker-9:  7:  [rank5]: chatter\n"  # three prefixes: the head holds three tokens
        b"  node-3: [default1]:[rank6]:\tchatter\n"
        b"noise\rworker-8: [rank7]: chatter\n"  # a `\r` piece has a head of its own
        b" iteration 10/ 100 | lm loss: 2.0 |\n"
    )
    _same(str(path))
    got = import_log(str(path))
    assert {r: h.get("host") for r, h in got.headers.items()} == {5: "worker-9", 6: "node-3", 7: "worker-8"}


def test_a_remembered_prefix_parse_is_the_parse(tmp_path):
    """`Line` parses each distinct line head once; the parse of the whole line agrees on every line."""
    raws = [ln for p in LOGS for ln in open(p, encoding="utf-8").read().splitlines() if ln]
    raws += [
        "worker-1: [default0]:[rank8]: iteration 1/ 2 |",
        "worker-1:\u00a0[rank8]: x",
        "3:  [rank2]: 10.0.0.1: a",
        "node-12:x: y",
        "[default3]:[Rank 5] step=1, skipped=0",
        "  \t[rank4]:\tTraceback (most recent call last):",
    ]
    for raw in raws:
        ln = Line(raw, 1)
        rank, host, end = peel(raw)
        assert (ln.host, ln.text) == (host, raw[end:]), raw
        assert ln.rank == rank or (rank < 0 and "[Rank" in ln.text), raw


def _merged(paths: list[str]) -> pd.DataFrame:
    parts: dict[str, list[pd.DataFrame]] = {}
    for _, got in paths:
        if not isinstance(got, ImportProblem):
            for kind, df in got.frames.items():
                parts.setdefault(kind, []).append(df)
    merge_parts(parts)
    return pd.concat(parts["log_step"], ignore_index=True)


@pytest.mark.parametrize("workers", [False, True])
def test_logs_merged_as_they_come_equal_the_merge_of_all(monkeypatch, workers):
    import diag.importers.logs.many as many

    if workers:
        monkeypatch.setattr(many, "PARALLEL_BYTES", 0)
        monkeypatch.setattr(many.workers, "cores", lambda: 2)
        monkeypatch.delenv(many.workers.ENV, raising=False)
    paths = [os.path.join(FIX, n) for n in sorted(os.listdir(FIX)) if n.endswith(".log")]
    one_by_one = [(p, import_log(p)) for p in paths]
    got = import_logs(paths)
    assert [p for p, _ in got] == paths
    assert sum("log_step" in g.frames for _, g in got) == 1
    pd.testing.assert_frame_equal(_merged(got), _merged(one_by_one))


def test_every_keyword_holds_an_anchor():
    """The prefilter searches anchors, not the keywords: each keyword must contain one, or lines a
    reader reads would be dropped."""
    for word in prefilter.KEYWORDS:
        assert any(a in word for a in prefilter.ANCHORS), word
    assert all(any(a in w for w in prefilter.KEYWORDS) for a in prefilter.ANCHORS)


@pytest.mark.parametrize(("mb", "nodes", "chatter"), [(2, 2, 0), (2, 2, 3), (3, 1, 0)])
def test_the_fast_path_reads_the_bench_input_as_every_line_does(tmp_path, mb, nodes, chatter):
    """The bench's multi-rank input (every fixture family behind launcher prefixes, with and without
    lines no reader reads): the fast families (`fastpath`) read what offering every line reads. With
    several ranks in a file (3 MiB on one node), each prints every step: a record that holds the line's
    figures already is only touched (`MegatronReader.fast_iteration`)."""
    from bench.logs import make_input

    _, ranks = make_input(str(tmp_path), mb, nodes, chatter)
    assert ranks >= nodes * (1 + (mb > 2))
    for name in sorted(os.listdir(tmp_path)):
        _same(str(tmp_path / name))


def test_the_fast_path_reads_most_lines_of_the_bench_input(tmp_path, monkeypatch):
    """Not a speed test: the fast families do take the frequent lines (else the fast path is dead code
    and the comparison above proves nothing), and they are the lines the bench's `match` floor times."""
    from bench.logs import make_input, scan
    from diag.importers.logs import fastpath

    make_input(str(tmp_path), 1, 1)
    taken: list[str] = []
    orig = fastpath.FastLines.line

    def line(self, m, no, handler):
        ok = orig(self, m, no, handler)
        if ok:
            taken.append(handler.__name__)
        return ok

    monkeypatch.setattr(fastpath.FastLines, "line", line)
    import_log(str(tmp_path / "node00.log"))
    families = {"_megatron", "_ds_step", "_ds_timer", "_ds_overflow", "_ds_grad", "_bar", "_hf_dict"}
    assert families <= set(taken)
    assert scan([str(tmp_path / "node00.log")], match=True) == len(taken)


NEAR_MISSES = [
    # lines of the fast families with what the per-line way reads differently, or the fast patterns
    # must refuse: a nan, a running mean, a field that is no number, a head past the launcher prefixes,
    # non-ASCII, a [Rank] in the text, the family's keyword twice, blocks that take every line
    b" [2025-10-06 03:26:19] iteration 10/ 600 | lm loss: 1.0E+01 | loss scale: -1.0 | grad norm: 0.9 |",
    b" iteration 11/ 600 | lm loss: nan | loss scale: 1.0 | number of skipped iterations: 1 |",
    b" iteration 12/ 600 | elapsed time per iteration (ms): 4000.0/3900.0 | lm loss: 2.0 |",
    b" iteration 13/ 600 | lm loss: 2.0 | lm loss: 3.0 | loss: 4.0 | learning rate: 1.0E-04 |  ",
    b" iteration 14/ 600 | lr: [1e-4] | lm loss: 2.0 |",
    b"x:iteration 15/ 600 | lm loss: 2.0 |",
    b"worker-1:\xc2\xa0[rank8]: iteration 16/ 600 | lm loss: 2.0 |",
    b" iteration 18/ 600 | consumed samples: 5120 | \xce\xbb loss: 2.0 |",
    b"[2024-03-08 16:30:33,274] [INFO] [logging.py:96:log_dist] [Rank 2] step=20, skipped=1, lr=[1e-05], "
    b"mom=[(0.9, 0.999)]",
    b"[2024-03-08 16:30:33,274] [INFO] [logging.py:96:log_dist] step=30, skipped=2, lr=[1e-05, 2e-05]",
    b"[2024-03-08 16:30:33,274] [INFO] [timer.py:260:stop] epoch=0/micro_step=40/global_step=30, "
    b"RunningAvgSamplesPerSec=19.60, CurrSamplesPerSec=19.70, MemAllocated=4.32GB, MaxMemAllocated=38.49GB",
    b"[2024-03-08 16:30:33,300] [INFO] [loss_scaler.py:190:update_scale] [deepspeed] OVERFLOW! Rank 1 "
    b"Skipping step. Attempted loss scale: 65536, but hysteresis is 2. Reducing hysteresis to 1",
    b"[2024-03-08 16:30:33,301] [INFO] [unfused_optimizer.py:281:_update_scale] Grad overflow on "
    b"iteration: 7",
    b"[2024-03-08 16:30:33,302] [INFO] [unfused_optimizer.py:207:step] [deepspeed] fp16 dynamic loss scale "
    b"overflow! Skipping step. Attempted loss scale: 65536.0, reducing to 32768.0",
    b"Overflow detected. Skipping step. Attempted loss scale: nan",
    b"  5%|5         | 1/20 [00:01<00:19,  1.00s/it]\r 10%|#         | 2/20 [00:02<00:18,  1.00s/it]",
    b"worker-0: [rank1]:  15%|\xe2\x96\x88         | 3/20 [00:03<00:17,  1.5it/s]",
    b"  0%|          | 0/20 [00:00<?, ?it/s]",
    b"  Total optimization steps = 20",
    b"worker-0: [rank1]:   {'loss': 1.5, 'grad_norm': 2.0, 'learning_rate': 1e-05, 'epoch': 0.1}",
    b"  5%|5         | 1/20 [00:01<00:19,  1.00s/it]\r{'loss': 2.0, 'epoch': 0.05}\r"
    b" 10%|#         | 2/20 [00:02<00:18,  1.00s/it]\r   {'loss': '1.9', 'grad_norm': 'inf', 'epoch': 0.1}",
    b"{'loss': nan, 'grad_norm': 2.0, 'epoch': 0.15}",
    b"{'eval_loss': 1.2, 'Eval Runtime': 3.0, 'epoch': 0.2}",
    b"[Rank 1] {'loss': 1.4, 'epoch': 0.25}",
    b"{'train_runtime': 85.46, 'train_samples_per_second': 11.7, 'train_loss': 0.5, 'epoch': 1.0}",
    b"------------------------ arguments ------------------------",
    b"[2024-03-08 16:30:43,778] [INFO] [logging.py:96:log_dist] [Rank 0] step=40, skipped=3, lr=[9.8e-06]",
    b" iteration 19/ 600 | lm loss: 2.0 |",
    b"  log_interval .................................... 10",
    b"-------------------- end of arguments ---------------------",
    b"Traceback (most recent call last):",
    b" iteration 20/ 600 | lm loss: 2.0 |",
    b"RuntimeError: boom",
    b"[2024-03-08 16:30:43,778] [INFO] [logging.py:96:log_dist] [Rank 0] step=50, skipped=3, lr=[9.8e-06]",
    b" iteration 21/ 600 | lm loss: 2.0 |",
    b"  total_train_batch_size = 4",
    b"[2024-03-08 16:30:25,112] [INFO] [config.py:986:print_user_config]   json = {",
    b"[2024-03-08 16:30:43,778] [INFO] [logging.py:96:log_dist] [Rank 0] step=60, skipped=3, lr=[9.8e-06]",
    b"}",
]


# words that turn the fast path off for their chunk (a reader before the family's would take them)
POISONED = [
    b"[rank3]: iteration 17/ 600 | Segmentation fault: 1 |",
    b"torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
]


@pytest.mark.parametrize("order", ["as listed", "reversed"])
@pytest.mark.parametrize("poison", [False, True])
def test_near_misses_of_the_fast_families_read_as_every_line_reads(tmp_path, order, poison):
    lines = NEAR_MISSES + (POISONED if poison else [])
    lines = lines if order == "as listed" else lines[::-1]
    path = tmp_path / "near.log"
    path.write_bytes(b"\n".join(lines) + b"\n")
    _same(str(path))


def test_repeated_lines_with_no_keyword_still_name_their_ranks(tmp_path, monkeypatch):
    """A line seen before is skipped (`QUIET_KEPT`): the ranks of its heads were counted the first time,
    also when the remembered heads were forgotten since, or the remembered lines."""
    monkeypatch.setattr(prefilter, "QUIET_KEPT", 3)
    monkeypatch.setattr(prefilter, "_HEADS_KEPT", 2)
    lines = [f"worker-{i % 5}: [rank{i % 7}]: NCCL INFO Channel {i % 4}/0" for i in range(60)]
    lines[30] = " iteration 10/ 100 | lm loss: 2.0 |"
    path = tmp_path / "repeat.log"
    path.write_text("\n".join(lines) + "\n")
    _same(str(path))
    assert import_log(str(path)).ranks == list(range(7))


def test_a_step_printed_again_with_more_figures_reads_as_every_line_reads(tmp_path):
    """Several ranks print one iteration, not always with the same fields: a record that lacks a
    figure the next line prints takes it (the fast path only touches a record holding them all)."""
    path = tmp_path / "ranks.log"
    path.write_bytes(
        b"[rank0]: iteration 10/ 100 | lm loss: 2.0 |\n"
        b"[rank1]: iteration 10/ 100 | lm loss: 2.5 | grad norm: 1.0 | number of skipped iterations: 1 |\n"
        b"[rank1]: iteration 20/ 100 | lm loss: 2.5 | grad norm: 1.0 | number of skipped iterations: 0 |\n"
        b"[rank0]: iteration 20/ 100 | lm loss: 2.0 | grad norm: 3.0 | number of skipped iterations: 2 |\n"
        b"[rank2]: iteration 10/ 100 | lm loss: 2.0 | grad norm: 3.0 | number of skipped iterations: 2 |\n"
        b"[rank3]: iteration 20/ 100 | lm loss: 1e999 | grad norm: 3.0 | number of skipped iterations: 2 |\n"
    )
    _same(str(path))
    steps = import_log(str(path)).frames["log_step"].set_index("step")
    assert steps.loc[10, ["loss", "grad_norm", "skipped_iters"]].tolist() == [2.0, 1.0, 1.0]
    assert steps.loc[20, ["loss", "grad_norm", "rank", "loss_nonfinite"]].tolist() == [2.5, 1.0, 1, True]


def test_a_log_of_trainer_dicts_alone_reads_as_every_line_reads(tmp_path):
    """A log whose only HF lines are its log dicts (the fast path reads them): the family is named."""
    path = tmp_path / "dicts.log"
    path.write_bytes(
        b"worker-0: [rank0]:   {'loss': 1.5, 'grad_norm': 2.0, 'learning_rate': 1e-05, 'epoch': 0.1}\n"
        b"worker-0: [rank0]:   {'loss': 1.25, 'grad_norm': 2.5, 'learning_rate': 1e-05, 'epoch': 0.2}\n"
    )
    _same(str(path))
    got = import_log(str(path))
    assert got.headers[0]["log_families"] == ["hf"]
    assert got.frames["log_step"]["loss"].tolist() == [1.5, 1.25]


BLOCKS = [
    # DeepSpeed's config dump and Megatron's arguments dump, with a long log's chatter (and lines the
    # blocks read that hold no keyword: a config name without `print]`, `json = {`, a Unicode blank)
    "[2024-03-08 16:30:25,100] [INFO] [config.py:984:print] DeepSpeedEngine configuration:",
    "worker-1: [rank5]: gpu-node-3:4121:4388 [1] NCCL INFO Channel 02/0 : 1[1] -> 2[2] via P2P/CUMEM/read",
    "  train_batch_size ............. 64",
    "> building train, validation, and test datasets for GPT ...",
    "  zero_optimization_stage ...... 2",
    "------------------------ arguments ------------------------",
    "  log_interval ........ 5",
    "worker-2: [rank6]: > building train, validation, and test datasets for GPT ...",
    "  micro_batch_size\u00a0.......... 4",
    "  tensor_model_parallel_size ... 2",
    "  fp16_enabled ...... True",
    "-------------------- end of arguments ---------------------",
    "  gradient_accumulation_steps .... 8",
    "  bfloat16_enabled ...... True",
    "some chatter . with a dot",
    "[2024-03-08 16:30:25,112] [INFO] [config.py:986:print_user_config]   json = {",
    '    "train_batch_size": 64,',
    '    "gradient_accumulation_steps": 8',
    "}",
    " iteration 5/ 100 | lm loss: 2.0 | number of skipped iterations: 0 |",
]


@pytest.mark.parametrize("chatter", [0, 1, 2])
def test_lines_inside_a_config_or_arguments_dump_read_as_every_line_reads(tmp_path, chatter):
    """Inside an open dump only the lines it may read become `Line`s (`busy()`'s pattern): the
    others, chatter between the dump's lines, change nothing."""
    noise = ["worker-3: [rank7]: NCCL INFO Connected all rings", "  some_thing ... 1 (a name, blank, dot)"]
    json_at = next(i for i, ln in enumerate(BLOCKS) if "json = {" in ln)  # the JSON dump is read unbroken
    lines = [x for ln in BLOCKS[:json_at] for x in [ln, *noise[:chatter]]] + BLOCKS[json_at:]
    path = tmp_path / "blocks.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _same(str(path))
    got = import_log(str(path))
    header = got.headers[got.ranks[0]]
    assert (header["global_batch"], header["zero_stage"], header["micro_batch"], header["tp"]) == (
        64,
        2,
        4,
        2,
    )
    assert header["ds_config"] == {"train_batch_size": 64, "gradient_accumulation_steps": 8}
    assert {5, 6, 7} - set(got.ranks) == ({7} if not chatter else set())
