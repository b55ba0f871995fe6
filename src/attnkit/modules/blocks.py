"""Residual sublayers, the feed-forward network and the encoder block.

Dimensions: B batch, N tokens, C width, F hidden width of the feed-forward.
Post-norm is the Transformer paper's and BERT's `LayerNorm(x + sublayer(x))`;
pre-norm is `x + sublayer(LayerNorm(x))` (ViT, GPT-2; Xiong et al. 2020).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnkit.modules._checks import positive_int, probability
from attnkit.modules.attention import MultiHeadAttention

__all__ = [
    "ACTIVATIONS",
    "EncoderBlock",
    "FeedForward",
    "PostNormResidual",
    "PreNormResidual",
    "residual",
]

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
}


def _activation(activation: str | nn.Module) -> nn.Module:
    if isinstance(activation, nn.Module):
        return activation
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return ACTIVATIONS[activation]()


def _dropout(owner: nn.Module, x: Tensor) -> Tensor:
    """owner.drop(x) while training; in eval dropout is the identity, so the module call (a
    few µs, paid per sublayer and per token in a cached decode loop) is skipped."""
    return owner.drop(x) if owner.training else x


class FeedForward(nn.Module):
    """Position-wise feed-forward: Linear(C, F) -> activation -> dropout -> Linear(F, Co)."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        *,
        out_dim: int | None = None,
        activation: str | nn.Module = "gelu",
        dropout: float = 0.0,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        dim, hidden = positive_int("dim", dim), positive_int("hidden", hidden)
        out_dim = positive_int("out_dim", out_dim, optional=True)
        self.fc1 = nn.Linear(dim, hidden, bias=bias, **fk)
        self.act = _activation(activation)
        self.drop = nn.Dropout(dropout) if probability("dropout", dropout) > 0 else nn.Identity()
        self.fc2 = nn.Linear(hidden, dim if out_dim is None else out_dim, bias=bias, **fk)

    def forward(self, x: Tensor) -> Tensor:
        """(B, N, C) -> (B, N, Co)."""
        h = self.act(self.fc1(x))  # (B, N, F)
        return self.fc2(_dropout(self, h))


class PreNormResidual(nn.Module):
    """x + dropout(fn(norm(x), ...)); extra arguments go to `fn`."""

    def __init__(self, fn: nn.Module, norm: nn.Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.fn, self.norm = fn, norm
        self.drop = nn.Dropout(dropout) if probability("dropout", dropout) > 0 else nn.Identity()

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        return x + _dropout(self, self.fn(self.norm(x), *args, **kwargs))


class PostNormResidual(nn.Module):
    """norm(x + dropout(fn(x, ...))); extra arguments go to `fn`."""

    def __init__(self, fn: nn.Module, norm: nn.Module, dropout: float = 0.0) -> None:
        super().__init__()
        self.fn, self.norm = fn, norm
        self.drop = nn.Dropout(dropout) if probability("dropout", dropout) > 0 else nn.Identity()

    def forward(self, x: Tensor, *args, **kwargs) -> Tensor:
        return self.norm(x + _dropout(self, self.fn(x, *args, **kwargs)))


def residual(
    fn: nn.Module, norm: nn.Module, *, dropout: float = 0.0, norm_first: bool
) -> PreNormResidual | PostNormResidual:
    """The residual wrapper for `norm_first` (pre-norm) or not (post-norm)."""
    return (PreNormResidual if norm_first else PostNormResidual)(fn, norm, dropout)


class EncoderBlock(nn.Module):
    """Self-attention sublayer then feed-forward sublayer, each residual.

    Args:
        dim, num_heads, hidden: C, H and F.
        norm_first: pre-norm (True) or post-norm (False, the paper and BERT).
        dropout: on each sublayer output (and after the activation).
        attn_dropout: on the attention probabilities.
        activation: "gelu", "relu", ... or a module.
        norm_eps: LayerNorm epsilon (BERT 1e-12, ViT 1e-6, torch 1e-5).
        attn: an attention module to use instead of `MultiHeadAttention(dim, num_heads)`;
            it is called as `attn(x, mask=..., causal=...)` (and `pos=` when given).
        device, dtype: of the parameters created here, as for `torch.nn.Linear`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        hidden: int,
        *,
        norm_first: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        activation: str | nn.Module = "gelu",
        norm_eps: float = 1e-5,
        qkv_bias: bool = True,
        attn: nn.Module | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        dim, num_heads = positive_int("dim", dim), positive_int("num_heads", num_heads)
        probability("attn_dropout", attn_dropout)
        attn = attn or MultiHeadAttention(
            dim, num_heads, qkv_bias=qkv_bias, dropout=attn_dropout, **fk
        )
        ff = FeedForward(dim, hidden, activation=activation, dropout=dropout, **fk)
        norm = lambda: nn.LayerNorm(dim, eps=norm_eps, **fk)  # noqa: E731
        self.attn = residual(attn, norm(), dropout=dropout, norm_first=norm_first)
        self.ff = residual(ff, norm(), dropout=dropout, norm_first=norm_first)

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        pos: Tensor | None = None,
    ) -> Tensor:
        """(B, N, C) -> (B, N, C); mask as in `MultiHeadAttention.forward`.

        pos: positions (B, N, C) (or broadcastable) added to the query and key inputs
            of the self-attention only, never to the values nor to the residual
            stream (DETR, Carion et al. 2020: every layer sees them afresh). Pre-norm
            adds them after the norm, as DETR's `normalize_before` does.
        """
        extra = {} if pos is None else {"pos": pos}  # a custom `attn` need not know pos
        return self.ff(self.attn(x, mask=mask, causal=causal, **extra))
