"""Attention before the Transformer: additive (Bahdanau) and multiplicative (Luong) scores,
and attention pooling for sequence classification.

Dimensions: B batch, N query length, S key/value length (T for pooling), Cq
query width, Ck key width, Cv value width, A hidden width of the additive score.

    additive        score(q, k) = vᵀ tanh(s · (W_q q + b + W_k k))   Bahdanau et al. 2015, A.1.2
    multiplicative  score(q, k) = s · qᵀ W k      Luong et al. 2015, §3.1 ("general"; W = I: "dot")
    pooling         score_t = vᵀ tanh(W x_t + b)     Raffel & Ellis 2015; Yang et al. 2016 (HAN)

Then softmax over keys with the mask, and a weighted sum of the values. The
teaching form tanh(W₁x + W₂x) of pooling, with the same x twice, is
tanh((W₁ + W₂)x): one matrix W here.

Every layer sends its scores through an `Attend` as an additive bias (the
dot-product term is zero: q and k of width 1 hold zeros), so masks, fully
masked rows, dropout and `attnkit.record_attention` work exactly as for
multi-head attention: weights are recorded as `(B, 1, N, S)`. Masks are boolean,
True = may attend, broadcastable to `(B, 1, N, S)`; a query row that may attend
to nothing gets output 0 (never NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.modules._checks import positive_int
from attnkit.modules.attention import Attend

__all__ = ["AdditiveAttention", "AttentionPooling", "LuongAttention"]


def _init_uniform(v: Tensor) -> None:
    bound = v.shape[0] ** -0.5  # nn.Linear's default range for one output unit
    nn.init.uniform_(v, -bound, bound)


def _attend_scores(attend: Attend, scores: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(scores, masked) · values through `attend`: scores (B, N, S), values (B, S, Cv)."""
    b, n, s = scores.shape
    zq = scores.new_zeros(b, 1, n, 1)  # (B, 1, N, 1): q·kᵀ = 0, the score is all bias
    zk = scores.new_zeros(b, 1, s, 1)  # (B, 1, S, 1)
    out = attend(zq, zk, values[:, None], mask=mask, bias=scores[:, None]).out  # (B, 1, N, Cv)
    return out[:, 0]


def _check(name: str, t: Tensor, width: int | None, batch: int | None = None) -> None:
    if not isinstance(t, Tensor) or t.dim() != 3:
        got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} must have shape (B, L, C), got {got}")
    if width is not None and t.shape[-1] != width:
        raise ValueError(f"{name} must have width {width}, got shape {tuple(t.shape)}")
    if batch is not None and t.shape[0] != batch:
        raise ValueError(f"{name} must have batch {batch}, got shape {tuple(t.shape)}")


class _ScoredAttention(nn.Module):
    """Shared forward of the scoring layers: check shapes, score, attend. Subclasses
    define `scores(query, key) -> (B, N, S)`, `attend`, `dim` and `key_dim`."""

    dim: int | None
    key_dim: int | None

    def forward(
        self, query: Tensor, value: Tensor, key: Tensor | None = None, *, mask: Tensor | None = None
    ) -> Tensor:
        """query (B, N, Cq), value (B, S, Cv), key (B, S, Ck) (default: value) -> (B, N, Cv).

        mask: boolean, True = may attend, broadcastable to (B, 1, N, S); rows
        that see nothing give 0.
        """
        key = value if key is None else key
        _check("query", query, self.dim)
        _check("value", value, None, query.shape[0])
        _check("key", key, self.key_dim, query.shape[0])
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                f"key and value must have the same length S, got {tuple(key.shape)} "
                f"and {tuple(value.shape)}"
            )
        return _attend_scores(self.attend, self.scores(query, key), value, mask)


class AdditiveAttention(_ScoredAttention):
    """Bahdanau (additive) attention: score(q, k) = vᵀ tanh(s · (W_q q + b + W_k k)).

    Args:
        dim: query width Cq.
        key_dim: key width Ck (default Cq).
        hidden: A, the width of the score's hidden layer. None: no projections
            (W_q = W_k = I, so Ck must equal Cq) and a learnable scalar s
            (initially 1) — the form of Keras's `AdditiveAttention` (s = 1,
            v = its `scale`) and of its `Attention(score_mode="concat")`
            (s = `scale`, v = `concat_score_weight`·1). With projections, s is
            a constant 1 (W absorbs it) and is not saved.
        dropout, backend: as for `Attend`.
        device, dtype: of the parameters, as for `torch.nn.Linear`.

    Parameters: `q_proj` (Cq -> A, with bias b) and `k_proj` (Ck -> A, no bias),
    both `nn.Identity` without `hidden`; `v` (A,); `inner_scale` () without `hidden`.
    """

    def __init__(
        self,
        dim: int,
        key_dim: int | None = None,
        hidden: int | None = None,
        *,
        dropout: float = 0.0,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        dim, hidden = positive_int("dim", dim), positive_int("hidden", hidden, optional=True)
        key_dim = dim if key_dim is None else positive_int("key_dim", key_dim)
        if hidden is None:
            if key_dim != dim:
                raise ValueError(f"key_dim={key_dim} != dim={dim} needs projections: pass hidden")
            self.q_proj: nn.Module = nn.Identity()
            self.k_proj: nn.Module = nn.Identity()
            self.inner_scale = nn.Parameter(torch.empty((), **fk))
        else:
            self.q_proj = nn.Linear(dim, hidden, **fk)
            self.k_proj = nn.Linear(key_dim, hidden, bias=False, **fk)
            # a constant 1, recomputed by reset_parameters (after `to_empty`)
            self.register_buffer("inner_scale", torch.empty((), **fk), persistent=False)
        self.v = nn.Parameter(torch.empty(dim if hidden is None else hidden, **fk))
        self.attend = Attend(scale=1.0, dropout=dropout, backend=backend)
        self.dim, self.key_dim = dim, key_dim
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """s = 1, v uniform in ±1/sqrt(A) (the projections reset themselves)."""
        nn.init.ones_(self.inner_scale)
        _init_uniform(self.v)

    def scores(self, query: Tensor, key: Tensor) -> Tensor:
        """query (B, N, Cq), key (B, S, Ck) -> unnormalised scores (B, N, S)."""
        q = self.q_proj(query)[:, :, None]  # (B, N, 1, A)
        k = self.k_proj(key)[:, None]  # (B, 1, S, A)
        return (self.v * torch.tanh(self.inner_scale * (q + k))).sum(-1)  # (B, N, S)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, key_dim={self.key_dim}, hidden={self.v.shape[0]}"


class LuongAttention(_ScoredAttention):
    """Luong (multiplicative) attention: score(q, k) = s · qᵀ W k.

    Args:
        dim: query width Cq for the "general" score (a weight W: Ck -> Cq);
            None gives the "dot" score (W = I, query and key widths must agree).
        key_dim: Ck (default Cq), only with `dim`.
        dropout, backend: as for `Attend`.
        device, dtype: of the parameters, as for `torch.nn.Linear`.

    Parameters: `scale` s () (initially 1: Luong's unscaled score; Keras's
    `Attention(use_scale=True)` learns it), `general` (`nn.Linear` without bias,
    or `nn.Identity` for "dot"). Luong's "concat" score is `AdditiveAttention`.
    """

    def __init__(
        self,
        dim: int | None = None,
        key_dim: int | None = None,
        *,
        dropout: float = 0.0,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        dim = positive_int("dim", dim, optional=True)
        key_dim = positive_int("key_dim", key_dim, optional=True)
        if dim is None and key_dim is not None:
            raise ValueError("key_dim needs dim (the general score's weight maps Ck -> Cq)")
        self.general: nn.Module = (
            nn.Identity()
            if dim is None
            else nn.Linear(dim if key_dim is None else key_dim, dim, bias=False, **fk)
        )
        self.scale = nn.Parameter(torch.empty((), **fk))
        self.attend = Attend(scale=1.0, dropout=dropout, backend=backend)
        self.dim, self.key_dim = dim, None  # the general weight checks the key width
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """s = 1: Luong's unscaled score (the general weight resets itself)."""
        nn.init.ones_(self.scale)

    def scores(self, query: Tensor, key: Tensor) -> Tensor:
        """query (B, N, Cq), key (B, S, Ck) -> unnormalised scores (B, N, S)."""
        k = self.general(key)  # (B, S, Cq)
        if k.shape[-1] != query.shape[-1]:
            raise ValueError(
                f"dot score: query width {query.shape[-1]} != key width {k.shape[-1]}; "
                "pass dim (and key_dim) for the general score"
            )
        return torch.matmul(query, k.transpose(-2, -1)) * self.scale  # (B, N, S)


class AttentionPooling(nn.Module):
    """Additive attention pooling over time: (B, T, C) -> (B, C).

    score_t = vᵀ tanh(W x_t + b), weights = softmax over the real steps, output
    Σ_t weights_t · x_t. The weights pass through `self.attend`: read them with
    `attnkit.record_attention(model)`, shape (B, 1, 1, T).

    Args:
        dim: C.
        hidden: A (default C).
        dropout, backend: as for `Attend` (dropout on the pooling weights).
        device, dtype: of the parameters, as for `torch.nn.Linear`.
    """

    def __init__(
        self,
        dim: int,
        hidden: int | None = None,
        *,
        dropout: float = 0.0,
        backend: str = "auto",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dim = positive_int("dim", dim)
        hidden = dim if hidden is None else positive_int("hidden", hidden)
        self.proj = nn.Linear(dim, hidden, device=device, dtype=dtype)
        self.v = nn.Parameter(torch.empty(hidden, device=device, dtype=dtype))
        self.attend = Attend(scale=1.0, dropout=dropout, backend=backend)
        self.dim, self.key_dim = dim, None  # the general weight checks the key width
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """v uniform in ±1/sqrt(A) (the projection resets itself)."""
        _init_uniform(self.v)

    def scores(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> unnormalised scores (B, T)."""
        return torch.tanh(self.proj(x)) @ self.v  # (B, T)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x (B, T, C), mask (B, T) boolean, True = real step -> (B, C).

        A sequence with no real step pools to 0 (never NaN).
        """
        _check("x", x, self.dim)
        if mask is not None:
            if mask.dtype != torch.bool or tuple(mask.shape) != tuple(x.shape[:2]):
                raise ValueError(
                    f"mask must be boolean (B, T) = {tuple(x.shape[:2])} with True = real step, "
                    f"got {mask.dtype} {tuple(mask.shape)}"
                )
            mask = mask[:, None, None, :]  # (B, 1, 1, T)
        scores = self.scores(x)[:, None, :]  # (B, 1, T): one query
        return _attend_scores(self.attend, scores, x, mask)[:, 0]  # (B, C)
