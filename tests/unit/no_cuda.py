"""torch as a framework module sees it on a machine without a GPU (Megatron's optimizer and grad
scaler put their scale tensors on 'cuda'): the unit tests patch it into the framework module."""

from __future__ import annotations

from typing import Any

import torch


class NoCudaTorch:
    """torch as a module that has no GPU: `torch.tensor(..., device='cuda')` lands on the CPU."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def tensor(self, *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.tensor(*args, **kwargs)
