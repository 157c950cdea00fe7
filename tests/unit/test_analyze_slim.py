"""Bounded-memory analysis (issue 14): `diag analyze` imports a GPU rank's host ops cut to what the
metrics and rules read of them (`kineto.slim_host_ops`). The report must be the one the whole
import gives, on every sample and fixture that holds a Kineto trace (the cut touches nothing else:
diag traces, logs and Flight Recorder dumps are imported as before)."""

from __future__ import annotations

import os

import pytest
from diag.analyzers import run_all

from diag.importers import detect, input_files, load_inputs, runs
from diag.metrics.stage import Metrics
from diag.report import json_report, model
from tests.conftest import ROOT, sample_folders

FOLDERS = sample_folders()


def _kineto(folder: str) -> list[str]:
    items, _ = input_files([folder])
    return [p for p, k in items if (k or detect.kind_of_file(p)) == detect.KINETO]


WITH_KINETO = [f for f in FOLDERS if _kineto(f)]


def _report(paths: list[str], slim: bool) -> tuple[str, int]:
    """(the JSON report, rows of host ops imported) of `paths` as `diag analyze --json` makes it."""
    trace = load_inputs(paths, slim=slim)
    metrics = Metrics(trace)
    findings, failures = run_all(trace, None, metrics)
    return json_report.render(model.build(trace, findings, failures, metrics)), len(trace.frame("cpu_op"))


def test_the_samples_hold_gpu_and_cpu_kineto_traces():
    names = {os.path.basename(f) for f in WITH_KINETO}
    assert {"kineto_gloo_dp", "kineto_gpt_ds_fp16", "hta_dlrm_8rank", "hta_dlrm_torchrec"} <= names


def _each_run(folder: str) -> list[list[str]]:
    """The folder's inputs, one list per run (as `diag analyze --each-run` splits them)."""
    try:
        load_inputs([folder])
        return [[folder]]
    except runs.MixedRuns as e:
        return e.runs


@pytest.mark.parametrize("folder", WITH_KINETO, ids=os.path.basename)
def test_slim_import_gives_the_same_report(folder):
    for paths in _each_run(folder):
        whole, whole_rows = _report(paths, slim=False)
        slim, slim_rows = _report(paths, slim=True)
        assert slim == whole
        assert slim_rows <= whole_rows


@pytest.mark.parametrize("name", ["gpu-rank0.json.gz", "rank0.json.gz"])
def test_only_a_gpu_rank_loses_host_ops(name):
    """A GPU rank keeps a few host ops (each name once, the first and last); a CPU-only rank, whose
    host ops are its activity, keeps them all."""
    path = os.path.join(ROOT, "sample_traces", "kineto_gloo_dp", name)
    whole = load_inputs([path]).frame("cpu_op")
    slim = load_inputs([path], slim=True).frame("cpu_op")
    if name.startswith("gpu"):
        assert len(slim) < len(whole) / 5
        assert list(slim["name"].astype(str).unique()) == list(whole["name"].astype(str).unique())
        assert (slim["ts"].min(), slim["ts"].max()) == (whole["ts"].min(), whole["ts"].max())
    else:
        assert len(slim) == len(whole)
