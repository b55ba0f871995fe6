"""Relative positions as an additive attention bias: ALiBi and T5 buckets (no parameters).

Dimensions: B batch, H heads, N query length, S key length.

Both give a float bias for `attention(..., bias=)` (added to the scaled
scores), so every backend takes them unchanged. Queries sit at the last N of
the S key positions (query i at position i + S - N), the bottom-right alignment
of attnkit's causal masks: with a cache of S - N past tokens the N new queries
get the right distances.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["alibi_bias", "alibi_slopes", "padding_positions", "relative_position_bucket"]


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def alibi_slopes(num_heads: int, *, dtype=torch.float32, device=None) -> Tensor:
    """ALiBi's head slopes m_h, shape (H,) (Press et al. 2022, §3).

    For H a power of two: the geometric sequence 2^(-8/H), 2^(-16/H), ..., 2^(-8).
    Otherwise the slopes of the closest smaller power of two P, followed by every
    other slope of 2P (odd powers) for the H - P remaining heads: the authors'
    code and Bloom's ``build_alibi_tensor``.
    """
    _check_int("num_heads", num_heads, 1)
    p = 2 ** math.floor(math.log2(num_heads))

    def geometric(count: int) -> Tensor:  # 2^(-8/count), its powers 1 .. count
        return 2.0 ** (-8.0 / count * torch.arange(1, count + 1, dtype=torch.float64))

    extra = geometric(2 * p)[0::2][: num_heads - p]  # odd powers of 2^(-8/2P)
    return torch.cat([geometric(p), extra]).to(dtype=dtype, device=device)


def padding_positions(mask: Tensor) -> Tensor:
    """Positions that skip padding: (B, S) bool (True = real token) -> (B, S) long.

    Real tokens are numbered 0, 1, ... in order; a padding slot gets the number
    of the real token before it (0 before the first), which does not matter
    since the mask hides it. With left padding this is what Bloom's alibi and
    Llama's ``position_ids`` use.
    """
    if not isinstance(mask, Tensor) or mask.dim() != 2 or mask.dtype != torch.bool:
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask)
        raise ValueError(f"mask must be a bool tensor of shape (B, S), got {got}")
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def alibi_bias(
    num_heads: int,
    n: int,
    s: int | None = None,
    *,
    positions: Tensor | None = None,
    symmetric: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """ALiBi bias -m_h · (p_i - p_j), shape (1, H, N, S), or (B, H, N, S) with `positions`.

    n, s: query and key lengths (s defaults to n; n <= s). Query i is the key at
        position i + s - n (bottom-right, as attnkit's causal masks).
    positions: optional (B, S) integer key positions, e.g.
        `padding_positions(keep)` so padding does not count as distance.
    symmetric: use -m_h · |p_i - p_j| (an encoder without a causal mask, as
        x-transformers' ``AlibiPositionalBias``). The default is the paper's
        causal form, in which future keys would get a positive bias: pass
        ``causal=True`` (or a causal mask) to `attention` with it.

    Bloom adds m_h · p_j instead; it differs from the default by -m_h · p_i, the
    same for every key of a query row, so softmax (and the output) is the same.
    Computed in float64 and cast to `dtype`.
    """
    _check_int("n", n, 0)
    s = n if s is None else s
    _check_int("s", s, n)
    slopes = alibi_slopes(num_heads, dtype=torch.float64, device=device)  # (H,)
    if positions is None:
        pos = torch.arange(s, dtype=torch.float64, device=device)[None]  # (1, S)
    else:
        if not isinstance(positions, Tensor) or positions.dim() != 2 or positions.shape[1] != s:
            got = tuple(positions.shape) if isinstance(positions, Tensor) else type(positions)
            raise ValueError(f"positions must have shape (B, S={s}), got {got}")
        pos = positions.to(device=device or positions.device, dtype=torch.float64)  # (B, S)
        slopes = slopes.to(pos.device)
    rel = pos[:, None, :] - pos[:, s - n :, None]  # (B or 1, N, S): p_j - p_i
    if symmetric:
        rel = -rel.abs()
    # m·(p_j - p_i) = -m·(p_i - p_j), with +0.0 (not -0.0) on the diagonal
    return (slopes[None, :, None, None] * rel[:, None]).to(dtype)  # (B or 1, H, N, S)


def relative_position_bucket(
    relative_position: Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5's bucket of each relative position j - i (Raffel et al. 2020, §2.1), same shape, long.

    Half of the buckets (per direction when `bidirectional`) hold the distances
    0 .. num_buckets/2 - 1 exactly; the rest cover larger distances on a log
    scale up to `max_distance`, beyond which all share the last bucket. Causal
    (``bidirectional=False``): keys after the query (j > i) fall in bucket 0,
    the same as distance 0; a causal mask hides them anyway.

    Equal, integer for integer, to `transformers`' T5Attention._relative_position_bucket
    (the log is taken in float32 as there, so the boundaries agree).
    """
    _check_int("num_buckets", num_buckets, 2)
    _check_int("max_distance", max_distance, 1)
    rel = relative_position.long()
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = (-rel).clamp_min(0)  # distance to an earlier key; later keys -> 0
    max_exact = num_buckets // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(
            f"num_buckets and max_distance: the exact range num_buckets/"
            f"{4 if bidirectional else 2} = {max_exact} must be >= 1 and < "
            f"max_distance={max_distance}"
        )
    # clamp_min(1) only keeps log() finite where the exact branch is taken anyway
    log_ratio = torch.log(rel.clamp_min(1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp_max(num_buckets - 1)
    return buckets + torch.where(rel < max_exact, rel, large)
