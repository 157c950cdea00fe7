"""The GPU-health sidecar: NVML samples of every local GPU, written beside the rank files.

It runs outside the training job (`diag top` starts it; `python -m diag.nvml <trace_dir>` on other
nodes), so it is not a collector and may import pynvml: `sidecar` (the thread and its file),
`sample` (one GPU's fields), `seam` (the NVML boundary: a value or `NA`, never raising).
"""
