"""`diag demo`'s summary prints what the job named (modules, overflow sources) as plain text."""

from __future__ import annotations

import io
import os

from rich.console import Console

from diag.cli.demo_summary import print_summary
from diag.trace.reader import load_trace
from tests.conftest import ROOT


def test_names_the_job_gave_are_printed_verbatim_never_as_markup():
    trace = load_trace(os.path.join(ROOT, "sample_traces", "fp16_overflow"))
    odd = "blocks[/0].attn [bold]"
    layers = trace.layers.copy()
    layers["module"] = layers["module"].astype(str).where(layers["depth"] != layers["depth"].max(), odd)
    trace.frames["layer"] = layers
    overflow = trace.overflow.copy()
    overflow["source"] = "scaler[/x]"
    trace.frames["overflow"] = overflow
    out = io.StringIO()
    print_summary(trace, Console(file=out, width=200))
    text = out.getvalue()
    assert odd in text and "scaler[/x]" in text
