"""Relative position modules: rotary embedding (RoPE), ALiBi bias, T5 relative bias.

Dimensions: B batch, H heads, Hkv key/value heads, N query length, S key
length, D head width, R rotary width.

`RotaryEmbedding` rotates q and k (pass it as ``MultiHeadAttention(...,
rotary=)``); `AlibiBias` and `RelativePositionBias` return an additive bias
(1, H, N, S) for ``MultiHeadAttention(..., bias=)``, or, with O(N) memory instead of
O(N·S), a score function (`attnkit.score_mods`) for ``MultiHeadAttention(..., score_mod=)``
that the attention kernels evaluate block by block (``.score_mod(n, s)``; same numbers). All
three take the key length S and the query length N with queries at the last N key positions,
so a decoder step with a cache of S - N tokens gets the right positions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.functional import score_mods
from attnkit.functional._trace import tracing
from attnkit.functional.relative import alibi_bias, alibi_slopes, relative_position_bucket
from attnkit.functional.rotary import apply_rotary, rotary_tables
from attnkit.modules._checks import position_ids as checked_positions
from attnkit.modules._checks import positive_int

__all__ = ["AlibiBias", "RelativePositionBias", "RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Rotary position embedding of q and k, with cached cos/sin tables.

    Args:
        dim: rotary width R (even, <= the head width D; D - R channels pass).
        base: frequency base θ (10000 as RoFormer / Llama 2).
        interleaved: pair channels (2i, 2i+1) as GPT-J / RoFormer, instead of
            (i, i + R/2) as Llama / NeoX (see `attnkit.functional.rotary`).

    The tables are non-persistent buffers (float32, or float64 for float64
    inputs), grown when a position past the cached ones is asked for; they are
    not in the state dict.
    """

    def __init__(
        self,
        dim: int,
        *,
        base: float = 10000.0,
        interleaved: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = positive_int("dim", dim)
        if dim % 2:
            raise ValueError(f"dim (the rotary width) must be even, got {dim}")
        if not base > 0:
            raise ValueError(f"base must be > 0, got {base!r}")
        self.base, self.interleaved = float(base), bool(interleaved)
        fk = {"device": device, "dtype": dtype}
        self.register_buffer("cos", torch.empty(0, dim // 2, **fk), persistent=False)
        self.register_buffer("sin", torch.empty(0, dim // 2, **fk), persistent=False)

    def reset_parameters(self) -> None:
        """Drop the cached tables (e.g. garbage after `to_empty`); they are rebuilt on use."""
        self.cos, self.sin = self.cos[:0], self.sin[:0]

    def tables(
        self, n: int, offset: int = 0, *, like: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """cos, sin (N, R/2) for positions offset .. offset + N - 1.

        float64 when `like` is float64 (so float64 checks are exact), else float32
        (`apply_rotary` casts to the input's dtype), on `like`'s device.
        """
        end = offset + n
        dtype = torch.float64 if like is not None and like.dtype == torch.float64 else torch.float32
        device = self.cos.device if like is None else like.device
        if end > self.cos.shape[0] or self.cos.dtype != dtype or self.cos.device != device:
            # Grow to a power of two so that a decoder step does not rebuild every time.
            size = max(64, 1 << max(end - 1, 0).bit_length(), self.cos.shape[0])
            cos, sin = rotary_tables(size, self.dim, base=self.base, dtype=dtype, device=device)
            self.cos, self.sin = cos, sin  # buffers: follow .to(device)
        return self.cos[offset:end], self.sin[offset:end]

    def rotate(self, x: Tensor, offset: int = 0, *, position_ids: Tensor | None = None) -> Tensor:
        """x (B, H, N, D) at positions offset .. offset + N - 1 -> same shape; or at the
        positions `position_ids` (N,) or (B, N) (a packed batch: `masks.document_positions`)."""
        if not isinstance(x, Tensor) or x.dim() != 4:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (B, H, N, D), got {got}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
        if position_ids is None:
            cos, sin = self.tables(x.shape[2], offset, like=x)  # (N, R/2) each
        else:
            pos = checked_positions(position_ids, x.shape[0], x.shape[2])  # (B|1, N)
            if pos.device.type == "meta" or tracing():  # no values to read: a fixed size
                size = max(x.shape[2], self.cos.shape[0])  # (packed positions are < N)
            else:
                size = int(pos.max()) + 1 if pos.numel() else 0
            cos, sin = self.tables(size, like=x)  # (size, R/2) each
            cos, sin = cos[pos], sin[pos]  # (B|1, N, R/2): the same rows offset.. would give
        return apply_rotary(x, cos, sin, interleaved=self.interleaved)

    def forward(
        self, q: Tensor, k: Tensor, *, offset: int = 0, position_ids: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """q (B, H, N, D), k (B, Hkv, N, D), both from positions offset.. -> rotated q, k.

        In a decoder with a cache, pass the new queries and the new keys with
        offset = the number of cached tokens; cached keys are already rotated.
        `position_ids` (N,) or (B, N): the tokens' positions instead (a packed batch,
        whose positions restart at each document).
        """
        return (
            self.rotate(q, offset, position_ids=position_ids),
            self.rotate(k, offset, position_ids=position_ids),
        )

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, interleaved={self.interleaved}"


class AlibiBias(nn.Module):
    """ALiBi (Press et al. 2022) as a module: `bias = alibi(n, s)` -> (1, H, N, S).

    No parameters: a non-persistent buffer `slopes` (H,) carries the device and
    dtype of the bias (so `.to()` moves it). `symmetric` uses -m·|i - j| for
    encoders (see `attnkit.functional.relative.alibi_bias`, which this calls).
    """

    def __init__(
        self,
        num_heads: int,
        *,
        symmetric: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.num_heads, self.symmetric = positive_int("num_heads", num_heads), bool(symmetric)
        slopes = alibi_slopes(num_heads, dtype=dtype or torch.get_default_dtype(), device=device)
        self.register_buffer("slopes", slopes, persistent=False)

    def reset_parameters(self) -> None:
        """Recompute the slopes in place (after `to_empty`)."""
        with torch.no_grad():
            self.slopes.copy_(alibi_slopes(self.num_heads, dtype=self.slopes.dtype))

    def score_mod(self, n: int, s: int | None = None) -> score_mods.ScoreMod:
        """The same bias as a score function for ``attention(..., score_mod=)``: queries at the
        last `n` of `s` key positions, never an (N, S) tensor (`attnkit.score_mods.alibi`)."""
        s = _lengths(n, s)
        return score_mods.alibi(self.slopes, offset=s - n, symmetric=self.symmetric)

    def forward(self, n: int, s: int | None = None, *, positions: Tensor | None = None) -> Tensor:
        """(1, H, N, S) bias, or (B, H, N, S) with (B, S) key `positions`. O(N·S) memory:
        `score_mod` gives the same scores in O(N)."""
        return alibi_bias(
            self.num_heads, n, s, positions=positions, symmetric=self.symmetric,
            dtype=self.slopes.dtype, device=self.slopes.device,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, symmetric={self.symmetric}"


class RelativePositionBias(nn.Module):
    """T5's learned relative position bias (Raffel et al. 2020, §2.1).

    Args:
        num_heads: H.
        num_buckets: rows of the learned table (num_buckets, H); T5 uses 32.
        max_distance: distances >= this share the last bucket; T5 uses 128.
        bidirectional: True for an encoder; False for a causal decoder (keys
            after the query share bucket 0).

    `forward(n, s)` returns the bias (1, H, N, S) for queries at key positions
    offset .. offset + N - 1, offset = S - N by default (a decoder step with a
    cache of S - N tokens; T5's ``past_seen_tokens``).
    """

    def __init__(
        self,
        num_heads: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = positive_int("num_heads", num_heads)
        self.num_buckets = positive_int("num_buckets", num_buckets)
        self.max_distance = positive_int("max_distance", max_distance)
        self.bidirectional = bool(bidirectional)
        # Checks num_buckets against max_distance once, here, not at the first call.
        relative_position_bucket(torch.zeros(1), **self._bucket_args())
        self.table = nn.Embedding(num_buckets, num_heads, device=device, dtype=dtype)

    def _bucket_args(self) -> dict:
        return {
            "bidirectional": self.bidirectional,
            "num_buckets": self.num_buckets,
            "max_distance": self.max_distance,
        }

    def score_mod(
        self, n: int, s: int | None = None, *, offset: int | None = None
    ) -> score_mods.ScoreMod:
        """The same bias as a score function for ``attention(..., score_mod=)``: the kernels
        read the (num_buckets, H) table (which gets its gradient) and never build (N, S)
        (`attnkit.score_mods.relative_bias` with `t5_buckets`). Queries as in `forward`."""
        s = _lengths(n, s)
        offset = s - n if offset is None else offset
        index = score_mods.t5_buckets(
            self.num_buckets, self.max_distance, bidirectional=self.bidirectional, offset=offset
        )
        return score_mods.relative_bias(self.table.weight, index)

    def forward(self, n: int, s: int | None = None, *, offset: int | None = None) -> Tensor:
        """(1, H, N, S) bias of queries offset .. offset + N - 1 against keys 0 .. S - 1 (O(N·S)
        memory; `score_mod` is the same in O(N))."""
        s = _lengths(n, s)
        offset = s - n if offset is None else offset
        device = self.table.weight.device
        query = torch.arange(offset, offset + n, device=device)[:, None]  # (N, 1)
        key = torch.arange(s, device=device)[None, :]  # (1, S)
        buckets = relative_position_bucket(key - query, **self._bucket_args())  # (N, S)
        return self.table(buckets).permute(2, 0, 1)[None]  # (N, S, H) -> (1, H, N, S)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )


def _lengths(n, s) -> int:
    """Check the query and key lengths; s (default n)."""
    s = n if s is None else s
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    if isinstance(s, bool) or not isinstance(s, int) or s < 0:
        raise ValueError(f"s must be an integer >= 0, got {s!r}")
    return s
