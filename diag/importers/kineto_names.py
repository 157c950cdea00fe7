"""Kineto-specific name handling: vectorized kernel classes and NCCL / Kineto dtype sizes.

The class names, kernel patterns and canonical op names are the project's vocabulary: `diag.vocab`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.vocab import (
    COMM,
    COMPUTE,
    MEMORY,
    MEMORY_KERNEL_CATS,
    MEMORY_KERNEL_RE,
    OTHER,
    OTHER_KERNEL_RE,
    comm_kernel_re,
)


def classify_kernels(names: pd.Series, cats: pd.Series) -> pd.Series:
    """One class per kernel (compute / comm / memory / other), vectorized over the names;
    communication is every `vocab.comm_kernel_re` kernel (NCCL, RCCL, DeepEP, NVSHMEM, the user's)."""
    s = names.astype(str)
    out = np.full(len(s), COMPUTE, dtype=object)
    out[s.str.contains(OTHER_KERNEL_RE, regex=True).to_numpy()] = OTHER
    mem = s.str.match(MEMORY_KERNEL_RE).to_numpy() | cats.isin(list(MEMORY_KERNEL_CATS)).to_numpy()
    out[mem] = MEMORY
    out[s.str.contains(comm_kernel_re(), regex=True).to_numpy()] = COMM
    return pd.Series(out, index=names.index, dtype="category")


_SIZE_WORDS = ((8, ("double", "float64", "long", "int64", "complex<float>")),
               (1, ("char", "int8", "uint8", "byte", "bool", "float8")),
               (2, ("half", "bfloat16", "float16", "short", "int16")),
               (4, ("float", "int", "uint32")))


def element_bytes(dtype: object) -> int:
    """Bytes per element of a Kineto / NCCL dtype string (`c10::Half`, `unsigned char`, `Float`,
    `BFloat16`, ...); 4 (fp32) when unknown or absent."""
    text = str(dtype).lower()
    for size, words in _SIZE_WORDS:
        if any(w in text for w in words):
            return size
    return 4
