"""Test helpers: measure matmul FLOPs with torch's counter, and a mirror of attnkit's MHA.

`FlopCounterMode` has formulas for mm/addmm/bmm/baddbmm, convolutions and the
CUDA SDPA kernels, but none for the CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``): on CPU,
``F.scaled_dot_product_attention`` is counted as 0 FLOPs. `count_flops` adds
torch's own SDPA formulas for the CPU kernel (they count all N·S products even
with ``is_causal``, like the dense formulas in `attnkit.analysis`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten

_CPU_SDPA = {
    aten._scaled_dot_product_flash_attention_for_cpu: (
        lambda q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_flop_count(q, k, v)
    ),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        lambda g, q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_backward_flop_count(
            g, q, k, v
        )
    ),
}


def counter() -> FlopCounterMode:
    return FlopCounterMode(display=False, custom_mapping=_CPU_SDPA)


def count_flops(fn, *args, **kwargs) -> int:
    """Matmul FLOPs that torch's counter sees while `fn(*args, **kwargs)` runs."""
    with counter() as fc:
        fn(*args, **kwargs)
    return fc.get_total_flops()


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def allowed_mask(n: int, s: int, causal: bool, window: int | None) -> torch.Tensor:
    """(N, S) True = may attend; bottom-right aligned (attnkit's convention), brute force."""
    pos = torch.arange(n)[:, None] + (s - n)
    distance = pos - torch.arange(s)[None, :]
    keep = torch.ones(n, s, dtype=torch.bool)
    if causal:
        keep &= distance >= 0
    if window is not None:
        keep &= distance.abs() < window
    return keep


# cost term -> the MirrorMHA submodule that computes it
MIRROR_TERMS = {
    "q_proj": "q", "k_proj": "k", "v_proj": "v", "scores (QKᵀ)": "scores",
    "weights·V": "weights_v", "out_proj": "o",
}  # fmt: skip


class MatMul(nn.Module):
    """a @ b as a module, so that FlopCounterMode reports it under its own name."""

    def forward(self, a, b):
        return torch.matmul(a, b)


class MirrorMHA(nn.Module):
    """Plain-torch multi-head attention with the constructor of attnkit.MultiHeadAttention.

    Every matmul term of `attnkit.analysis.mha_cost` is one submodule (TERMS), so that
    `FlopCounterMode.get_flop_counts()` measures the terms one by one (`MIRROR_TERMS`; the
    SDPA path has no separate score and weights·V modules).
    """

    def __init__(
        self, dim, num_heads, *, out_dim=None, context_dim=None, key_dim=None, value_dim=None,
        num_kv_heads=None, head_dim=None, v_head_dim=None, qkv_bias=True, out_bias=True,
        out_proj=True,
    ):  # fmt: skip
        super().__init__()
        self.h = num_heads
        self.g = num_kv_heads or num_heads
        self.d = head_dim or dim // num_heads
        self.dv = v_head_dim or self.d
        ck = key_dim or context_dim or dim
        cv = value_dim or context_dim or ck
        self.q = nn.Linear(dim, self.h * self.d, bias=qkv_bias)
        self.k = nn.Linear(ck, self.g * self.d, bias=qkv_bias)
        self.v = nn.Linear(cv, self.g * self.dv, bias=qkv_bias)
        self.scores, self.weights_v = MatMul(), MatMul()
        out_w = out_dim or dim
        self.o = nn.Linear(self.h * self.dv, out_w, bias=out_bias) if out_proj else nn.Identity()

    def forward(self, x, key=None, value=None, *, causal=False, window=None, sdpa=False):
        key = x if key is None else key
        value = key if value is None else value
        b, n, s = x.shape[0], x.shape[1], key.shape[1]
        q = self.q(x).view(b, n, self.h, self.d).transpose(1, 2)  # (B, H, N, D)
        k = self.k(key).view(b, s, self.g, self.d).transpose(1, 2)  # (B, G, S, D)
        v = self.v(value).view(b, s, self.g, self.dv).transpose(1, 2)  # (B, G, S, Dv)
        keep = allowed_mask(n, s, causal, window) if causal or window else None
        if sdpa:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, enable_gqa=self.g != self.h
            )
        else:
            k = k.repeat_interleave(self.h // self.g, dim=1)  # (B, H, S, D)
            v = v.repeat_interleave(self.h // self.g, dim=1)  # (B, H, S, Dv)
            scores = self.scores(q, k.transpose(-2, -1)) * self.d**-0.5  # (B, H, N, S)
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            out = self.weights_v(torch.softmax(scores, dim=-1), v)  # (B, H, N, Dv)
        return self.o(out.transpose(1, 2).reshape(b, n, self.h * self.dv))  # (B, N, C_out)


def flops_by_module(fn, *args, **kwargs) -> dict[str, int]:
    """Matmul FLOPs per module path (``"MirrorMHA.q"``, ...) while `fn(*args, **kwargs)` runs."""
    with counter() as fc:
        fn(*args, **kwargs)
    return {name: sum(ops.values()) for name, ops in fc.get_flop_counts().items()}
