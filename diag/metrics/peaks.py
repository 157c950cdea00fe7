"""Dense peak TFLOP/s of the accelerators MFU is usually quoted against, per matmul dtype.

Every figure is the vendor's own, WITHOUT 2:4 structured sparsity: NVIDIA's datasheets print the
tensor-core figures with sparsity (marked *, "specifications 1/2 lower without sparsity"), so the
dense peak is half the printed number; AMD's MI300X datasheet prints dense and sparse separately.
An fp32 job is measured against the TF32 tensor-core peak (what cuBLAS uses when TF32 is allowed);
a job that disallows TF32 should pass `--peak-tflops` with the plain FP32 figure. Anything not in
the table (other GPUs, CPUs) has no known peak: `diag analyze --peak-tflops N`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("bf16", "fp16", "fp8", "tf32")


@dataclass(frozen=True)
class Peak:
    device: str  # the table's name for it
    dtype: str
    tflops: float
    source: str


# (pattern on torch.cuda.get_device_name(), name, {dtype: dense TFLOP/s}, vendor source)
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"
_H100 = (
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper, table 'NVIDIA H100 SXM5/PCIe' "
    "(dense; the H100 datasheet prints twice these, with sparsity)"
)
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200; printed with sparsity)"
_B200 = "NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx; 8-GPU figures with sparsity, /8)"
_MI300X = "AMD Instinct MI300X data sheet (amd-instinct-mi300x-data-sheet.pdf; dense figures)"
TABLE: tuple[tuple[str, str, dict[str, float], str], ...] = (
    (
        r"MI300X",
        "AMD Instinct MI300X",
        {"tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
        _MI300X,
    ),
    (r"B200", "NVIDIA B200", {"tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0}, _B200),
    (r"H200 NVL", "NVIDIA H200 NVL", {"tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}, _H200),
    (r"H200", "NVIDIA H200 SXM", {"tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0}, _H200),
    (
        r"H100 NVL",
        "NVIDIA H100 NVL",
        {"tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
        "NVIDIA H100 NVL datasheet (printed with sparsity)",
    ),
    (r"H100.*PCIe", "NVIDIA H100 PCIe", {"tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}, _H100),
    (r"H100", "NVIDIA H100 SXM", {"tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}, _H100),
    (r"A100", "NVIDIA A100", {"tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, _A100),
)


def matmul_dtype(dtype: str | None) -> str | None:
    """The tensor-core dtype a job of this training dtype runs its matmuls in."""
    d = (dtype or "").lower()
    return {
        "bf16": "bf16",
        "bfloat16": "bf16",
        "fp16": "fp16",
        "float16": "fp16",
        "half": "fp16",
        "fp8": "fp8",
        "fp32": "tf32",
        "float32": "tf32",
        "tf32": "tf32",
    }.get(d)


def lookup(device_name: str | None, dtype: str | None) -> Peak | None:
    """The dense peak of `device_name` (as torch.cuda.get_device_name spells it) for `dtype`."""
    mm = matmul_dtype(dtype)
    if not device_name or mm is None:
        return None
    for pattern, name, peaks, source in TABLE:
        if re.search(pattern, device_name, re.IGNORECASE):
            return Peak(name, mm, peaks[mm], source) if mm in peaks else None
    return None


def unknown_reason(device_name: str | None, dtype: str | None) -> str:
    """Why `lookup` found nothing, as one line for the report."""
    if not device_name or device_name.lower().startswith("cpu"):
        return "no peak is known for a CPU (pass --peak-tflops N to get MFU)"
    if matmul_dtype(dtype) is None:
        return f"the job's dtype is not known on {device_name} (pass --peak-tflops N)"
    return f"no peak known for {device_name} {matmul_dtype(dtype)} (pass --peak-tflops N)"
