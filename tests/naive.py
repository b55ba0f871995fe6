"""A deliberately plain attention in float64: the truth the tests compare against."""

from __future__ import annotations

import torch


def naive_attention(q, k, v, *, mask=None, bias=None, causal=False, scale=None, keep=None):
    """softmax(scale·q·kᵀ + bias) over allowed keys, then ·v; rows seeing nothing give 0.

    q (B, H, N, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv); keep (B, H, N, S) optional
    dropout keep-mask already scaled. Returns (out float64, probs float64).
    """
    q, k, v = (t.double() for t in (q, k, v))
    h, n, s = q.shape[1], q.shape[2], k.shape[2]
    k = k.repeat_interleave(h // k.shape[1], dim=1)
    v = v.repeat_interleave(h // v.shape[1], dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        scores = scores + bias.double()
    allowed = torch.ones(scores.shape, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    if causal:
        i = torch.arange(n)[:, None]
        j = torch.arange(s)[None, :]
        allowed = allowed & (j <= i + s - n)
    allowed = allowed & ~torch.isneginf(scores)
    dead = ~allowed.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = torch.where(dead, 0.0, scores.amax(dim=-1, keepdim=True))
    exp = torch.exp(scores - top)  # masked keys: exp(-inf) = 0
    probs = exp / exp.sum(dim=-1, keepdim=True).clamp_min(1e-300)
    weights = probs if keep is None else probs * keep.double()
    return weights @ v, probs
