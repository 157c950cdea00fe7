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
    communication is every `vocab.comm_kernel_re` kernel (NCCL, RCCL, DeepEP, NVSHMEM, the user's).
    The patterns run once per distinct name (a trace has hundreds, repeated thousands of times)."""
    codes, uniques = pd.factorize(names.astype(str))
    u = pd.Series(uniques, dtype=object)
    kind = np.full(len(u), COMPUTE, dtype=object)
    kind[u.str.contains(OTHER_KERNEL_RE, regex=True).to_numpy()] = OTHER
    kind[u.str.match(MEMORY_KERNEL_RE).to_numpy()] = MEMORY
    comm_re = comm_kernel_re()
    kind[np.fromiter((comm_re.search(n) is not None for n in u), bool, len(u))] = COMM
    out = kind[codes] if len(codes) else np.empty(0, dtype=object)
    out[cats.isin(list(MEMORY_KERNEL_CATS)).to_numpy() & (out != COMM)] = MEMORY
    return pd.Series(out, index=names.index, dtype="category")


_SIZE_WORDS = (
    (8, ("double", "float64", "long", "int64", "complex<float>")),
    (1, ("char", "int8", "uint8", "byte", "bool", "float8")),
    (2, ("half", "bfloat16", "float16", "short", "int16")),
    (4, ("float", "int", "uint32")),
)


def element_bytes(dtype: object) -> int:
    """Bytes per element of a Kineto / NCCL dtype string (`c10::Half`, `unsigned char`, `Float`,
    `BFloat16`, ...); 4 (fp32) when unknown or absent."""
    text = str(dtype).lower()
    for size, words in _SIZE_WORDS:
        if any(w in text for w in words):
            return size
    return 4
