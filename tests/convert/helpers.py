"""Shared by the conversion tests: seeded inputs, weights that all count, padding masks."""

from __future__ import annotations

import torch
from torch import nn


def rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def randomize(model: nn.Module, seed: int = 0, scale: float = 0.1) -> nn.Module:
    """Add noise to every parameter (peers zero-initialise biases and set unit norms,
    which would hide a mis-mapped bias or norm); returns the model in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def padding(b: int, n: int, seed: int = 1) -> torch.Tensor:
    """A torch-style key padding mask (B, N), True = padding, first key always real."""
    kpm = rand(b, n, seed=seed) > 0.5
    kpm[:, 0] = False
    return kpm


def assert_close(got, want):
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
