"""Which backend `attention` runs a call on (`choose_backend`), from static facts only: shapes,
dtypes, flags, the device type and facts about this machine read at import, so that
torch.compile and torch.export trace one fixed choice.

Legend: B batch, H heads, N queries, S keys.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from attnkit._cpu import has_native_bf16

__all__ = [
    "BACKENDS",
    "MASK_ELEMS_CHUNKED",
    "NATIVE_BF16",
    "choose_backend",
    "mask_elems",
    "use_backend",
]

BACKENDS = ("auto", "reference", "fused", "chunked")

# What `use_backend` set (None: auto decides). A plain module global, not a ContextVar: Dynamo
# reads a global as a constant and guards on it (a changed choice recompiles), while a ContextVar
# read breaks the graph at every attention call.
override: str | None = None

# bfloat16 dot products in hardware, read once (see `choose_backend`).
NATIVE_BF16 = has_native_bf16()

# SDPA turns a boolean mask into a float mask of the mask's own broadcast shape (and
# `_sdpa_backend.fused` first combines mask, causal and bias into one), so a full (N, S) mask
# costs 4·N·S bytes on top of the kernel's O(N) memory. Measured (B=1, H=8, D=64, float32,
# fwd+bwd, arbitrary (N, S) mask): N=8192 SDPA +339 MiB, N=16384 SDPA +1.3 GiB (PERF-NOTES),
# chunked ~0.2 GiB at 16384; chunked is ~1.5-1.8x slower than SDPA with a mask at N=1024-2048
# (benchmarks/README.md). From 2**26 mask elements (256 MiB as float32; N=S=8192) memory wins
# and auto picks chunked; below, the float mask stays under 256 MiB and fused is kept for speed.
MASK_ELEMS_CHUNKED = 1 << 26


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Make calls that ask for ``backend="auto"`` use `name` inside the block.

    Explicit backends in a call are left alone. Nested blocks restore the outer
    choice on exit. The choice is process-wide (not per thread), so that compiled
    graphs see it as a constant: a compiled model called inside the block is
    recompiled for the new choice.
    """
    global override
    if name not in BACKENDS:
        raise ValueError(f"use_backend: name must be one of {BACKENDS}, got {name!r}")
    before, override = override, None if name == "auto" else name
    try:
        yield
    finally:
        override = before


def mask_elems(q: Tensor, k: Tensor, mask, bias: Tensor | None, causal: bool):
    """Elements of the float mask `_sdpa_backend.fused` would hand to SDPA (0: none, SDPA
    masks itself).

    Under torch.export with dynamic sizes this may be a symbolic size; `choose_backend`
    compares it without adding a guard (so the batch and length stay dynamic)."""
    shapes = [t.shape for t in (mask, bias) if t is not None]  # a description: a tuple
    if not shapes:
        return 0
    if causal:
        shapes.append(torch.Size((q.shape[2], k.shape[2])))  # (N, S)
    # The broadcast size dimension by dimension with sym_max: torch.broadcast_shapes guards
    # on (specialises) symbolic sizes under non-strict torch.export. The shapes were
    # meant to broadcast, so the larger size of each dimension is the broadcast one.
    total = 1
    for i in range(1, max(len(s) for s in shapes) + 1):
        size = 1
        for shape in shapes:
            if len(shape) >= i:
                d = shape[-i]  # an int, a SymInt (export), or a 0-d Tensor (jit.trace)
                size = torch.sym_max(size, d) if isinstance(d, torch.SymInt) else max(size, int(d))
        total = total * size
    return total


def choose_backend(
    requested: str,
    *,
    need_weights: bool,
    dropout: bool,
    mask_elems=0,
    low_precision_grad: bool = False,
    device_type: str = "cpu",
    structured: bool = False,
    score_mod=None,
    flex_fits: bool = False,
) -> str:
    """The backend a call runs on, from static facts only.

    `mask_elems` is what `mask_elems` returns for the call; `low_precision_grad` says that
    the inputs are bfloat16 and a gradient will be taken; `structured` that the mask is a
    `StructuredMask`; `flex_fits` that FlexAttention can run the call (`_flex_backend.fits`). Inside
    `use_backend` auto runs what it set.
    On CUDA a structured mask or a built-in score function goes to FlexAttention ("flex", an
    auto-only choice) where it fits. Otherwise, off the CPU (CUDA, MPS, ...) auto runs SDPA,
    whose kernels there do dropout and masks themselves (a structured mask goes as its dense
    form). A `score_mod` runs on chunked, except an additive built-in off the CPU, which SDPA
    takes as a dense bias.
    """
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    additive = bool(getattr(score_mod, "additive", False))
    if requested != "auto":
        if need_weights and requested != "reference":
            raise ValueError(
                f"need_weights=True needs backend 'reference' (or 'auto'); got {requested!r}, "
                "which does not materialise the probabilities"
            )
        if requested == "fused" and score_mod is not None and not additive:
            raise ValueError(
                f"backend 'fused' (SDPA) takes only additive score functions (attnkit."
                f"score_mods.alibi, relative_bias), as a dense bias; got score_mod={score_mod!r}: "
                "use backend 'chunked' or 'reference'"
            )
        return requested
    if need_weights:
        return "reference"
    if override is not None:
        if override == "fused" and score_mod is not None and not additive:
            return "chunked"
        return override
    # CUDA: structure and built-in score functions go to FlexAttention's kernels, which skip
    # what the BlockMask hides and compute the score function in the kernel (SDPA would take
    # the mask or the additive score function as a dense (N, S) tensor). `flex_fits` (see
    # `_flex_backend.fits`) says Flex runs the call: no dropout, bias or tensor mask, a
    # built-in score function, a dtype and head widths its kernels are built for.
    if device_type == "cuda" and flex_fits and (structured or score_mod is not None):
        return "flex"
    if score_mod is not None:
        # CUDA: dense-bias fallback for additive built-ins (O(B·H·N·S)), marked as a stand-in
        return "fused" if device_type != "cpu" and additive else "chunked"
    if device_type != "cpu":
        return "fused"
    # The chunked kernels skip the blocks a structured mask hides: time follows the density
    # (window 256 at N=4096: ~10x less work than SDPA with the same mask as a tensor).
    if structured:
        return "chunked"
    # SDPA leaves its fused CPU kernel for a slow math path as soon as dropout is
    # on (PERF-NOTES: ~12x slower at N=2048); the chunked kernel draws its
    # dropout bits cheaply and keeps O(N) memory. A mask size only known symbolically
    # (export with dynamic shapes) keeps fused rather than guard on the size.
    if dropout or surely_at_least(mask_elems, MASK_ELEMS_CHUNKED):
        return "chunked"
    # SDPA's bfloat16 backward on a CPU without bf16 units (AVX2 EPYC) is ~4x slower than
    # chunked, which computes in float32: fwd+bwd N=1024 (B=1, H=8, D=64, 1 thread) 618 ms vs
    # 149 ms. With AVX512-BF16/AMX (Sapphire Rapids) it is the faster one: 38 ms vs 62 ms.
    if low_precision_grad and not NATIVE_BF16:
        return "chunked"
    return "fused"


def surely_at_least(value, bound: int) -> bool:
    """``value >= bound`` for an int; for a symbolic size (export with dynamic shapes), True
    only if known statically. The symbolic check is imported here, not at module level:
    torch.fx.experimental.symbolic_shapes pulls in sympy, ~0.7 s of every CLI start."""
    if isinstance(value, int):
        return value >= bound
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(value >= bound)
