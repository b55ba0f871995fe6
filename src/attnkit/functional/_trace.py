"""Whether code runs inside a tracer (torch.compile, torch.export, torch.jit.trace), where a
data-dependent Python branch would break or bake in the graph."""

from __future__ import annotations

import torch

__all__ = ["tracing"]


def tracing() -> bool:
    """Inside torch.compile / torch.export / torch.jit.trace."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()
