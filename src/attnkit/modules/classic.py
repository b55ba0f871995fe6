"""The classic attention variants, assembled from MultiHeadAttention (no second attention class).

Dimensions: B batch, N tokens, C input width, Co output width, H heads.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from attnkit.modules._checks import positive_int, probability
from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.blocks import PostNormResidual

__all__ = ["T2TAttention", "bert_self_attention", "paper_attention"]


def paper_attention(
    d_model: int = 512, num_heads: int = 8, dropout: float = 0.1, *, device=None, dtype=None
) -> MultiHeadAttention:
    """Multi-head attention of "Attention Is All You Need" (§3.2.2).

    Four d_model × d_model projections (W^Q, W^K, W^V stored fused, W^O as
    `proj`), d_k = d_v = d_model / h, one mask shared by all heads. Base model:
    d_model 512, h 8, dropout 0.1.

    `dropout` acts on the attention probabilities (while training). That is not in the
    paper: §5.4 applies dropout to each sub-layer's output and to the embedding sums.
    Dropout on the weights comes from the tensor2tensor code and the Annotated
    Transformer, and most implementations since (BERT included) keep it; pass
    `dropout=0.0` for the attention exactly as the paper describes it.
    """
    d_model = positive_int("d_model", d_model)
    return MultiHeadAttention(d_model, num_heads, dropout=dropout, device=device, dtype=dtype)


def bert_self_attention(
    dim: int = 768,
    num_heads: int = 12,
    *,
    attn_dropout: float = 0.1,
    hidden_dropout: float = 0.1,
    eps: float = 1e-12,
    rotary: nn.Module | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> PostNormResidual:
    """BERT's attention block (Devlin et al. 2019): LayerNorm(x + dropout(dense(attention(x)))).

    The output dense layer is the attention's `proj`; LayerNorm's epsilon sits
    inside the square root, 1e-12 as in the released checkpoints. `rotary`: a
    `RotaryEmbedding` for q and k (RoFormer's BERT), as in `MultiHeadAttention`.
    """
    fk = {"device": device, "dtype": dtype}
    attn = MultiHeadAttention(
        dim, num_heads, dropout=probability("attn_dropout", attn_dropout), rotary=rotary, **fk
    )
    norm = nn.LayerNorm(dim, eps=eps, **fk)
    return PostNormResidual(attn, norm, probability("hidden_dropout", hidden_dropout))


class T2TAttention(nn.Module):
    """The attention of T2T-ViT's tokens-to-token transformer (Yuan et al. 2021).

    Tokens of width `dim` (e.g. 7·7 = 49 after a soft split) attend with a fused
    qkv of width 3·`chan`, heads of width chan / H, a projection chan -> chan,
    and — because input and output widths differ — the skip connection runs
    through V instead of x: out = v + proj(attention).

    Which width sets the softmax scale differs between implementations, so it is
    an explicit choice, `scale`:

    * ``"input"`` (default): (dim // H)^-0.5, the *input* width per head, as the
      reference code (`T2T-ViT/models/token_transformer.py`: ``head_dim = dim //
      num_heads`` with dim the input width). For 49 -> 64 with one head: 1/7.
    * ``"head"``: (chan // H)^-0.5, the width of the q·k heads, the usual
      1/sqrt(d_k) of scaled dot-product attention (and `MultiHeadAttention`'s
      default). For 49 -> 64 with one head: 1/8.
    * a positive float: that multiplier. None means ``"input"``.

    The chosen multiplier is `self.attn.attend.scale`.
    """

    def __init__(
        self,
        dim: int,
        chan: int,
        num_heads: int = 1,
        *,
        qkv_bias: bool = False,
        scale: float | Literal["input", "head"] | None = "input",
        attn_dropout: float = 0.0,
        proj_dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dim, chan = positive_int("dim", dim), positive_int("chan", chan)
        if chan % positive_int("num_heads", num_heads):
            raise ValueError(f"chan={chan} is not divisible by num_heads={num_heads}")
        self.attn = MultiHeadAttention(
            dim,
            num_heads,
            out_dim=chan,
            head_dim=chan // num_heads,
            qkv_bias=qkv_bias,
            scale=_t2t_scale(scale, dim, chan, num_heads),
            dropout=probability("attn_dropout", attn_dropout),
            device=device,
            dtype=dtype,
        )
        drop = probability("proj_dropout", proj_dropout)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()

    def forward(self, x: Tensor, *, mask: Tensor | None = None) -> Tensor:
        """(B, N, dim) -> (B, N, chan)."""
        q, k, v = self.attn.heads_qkv(x)  # (B, H, N, chan/H) each
        o = self.attn.attend(q, k, v, mask=mask).out  # (B, H, N, chan/H)
        merge = self.attn.merge_heads
        return merge(v) + self.drop(self.attn.proj(merge(o)))  # (B, N, chan)


def _t2t_scale(scale, dim: int, chan: int, num_heads: int) -> float:
    """The scores multiplier T2TAttention's `scale` names (see its docstring)."""
    if scale is None or scale == "input":
        if dim < num_heads:
            raise ValueError(
                f'scale="input" needs dim >= num_heads (it scales by (dim // num_heads)^-0.5), '
                f"got dim={dim}, num_heads={num_heads}"
            )
        return (dim // num_heads) ** -0.5
    if scale == "head":
        return (chan // num_heads) ** -0.5
    number = isinstance(scale, (int, float)) and not isinstance(scale, bool)
    if number and math.isfinite(scale) and scale > 0:
        return float(scale)
    raise ValueError(f'scale must be "input", "head" or a positive finite float, got {scale!r}')
