"""DETR's transformer (Carion et al. 2020, "End-to-End Object Detection with Transformers").

Dimensions: B batch, S = h·w feature-map tokens (the memory), Q object queries,
C model width (d_model), F feed-forward width, H heads, L decoder layers.

The encoder is a stack of attnkit `EncoderBlock`s, the decoder of `DecoderBlock`s
built non-causal (the object queries are a set). What makes it DETR's:

* positions are not added to the input once: every attention of every layer adds
  them to its queries and keys, never to its values (§3.2, A.3) — `pos` (the 2-D
  sine positions of the feature map, `attnkit.positional.detr_sine_2d`) in the
  encoder's self-attention and on the keys of the decoder's cross-attention,
  `query_pos` (the learned object queries) on the decoder's queries;
* the decoder input starts at zeros: a query is only its position embedding
  until the first layer has looked at the image;
* post-norm layers with a ReLU feed-forward; the decoder ends in a LayerNorm
  and can return every layer's (normalised) output, for the auxiliary losses.

Masks: `src_key_mask` (B, S) is True on real pixels, False on padding (attnkit's
polarity; DETR's `NestedTensor` mask and torch's key_padding_mask are the
opposite). Padded tokens are masked as keys only; an image with no real pixel
gives an attention output 0 (never NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.models.transformer import DecoderBlock, TransformerConfig
from attnkit.modules._checks import positive_int, probability
from attnkit.modules.blocks import EncoderBlock

__all__ = ["DetrDecoder", "DetrEncoder", "DetrTransformer"]


def _key_mask(src_key_mask: Tensor | None, x: Tensor) -> Tensor | None:
    """(B, S) True = real -> (B, 1, 1, S) for `attention`; checked against x (B, S, C)."""
    if src_key_mask is None:
        return None
    want = tuple(x.shape[:2])
    if src_key_mask.dtype != torch.bool or tuple(src_key_mask.shape) != want:
        raise ValueError(
            f"src_key_mask must be bool of shape (B, S) = {want}, True = real pixel, got "
            f"{src_key_mask.dtype} {tuple(src_key_mask.shape)}"
        )
    return src_key_mask[:, None, None, :]  # (B, 1, 1, S)


class DetrEncoder(nn.Module):
    """A stack of `EncoderBlock`s that adds `pos` to queries and keys in every layer.

    No final norm in DETR's post-norm layout (pass `norm` for a pre-norm stack).
    """

    def __init__(self, layers: list[EncoderBlock], norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm if norm is not None else nn.Identity()

    def forward(
        self, x: Tensor, *, src_key_mask: Tensor | None = None, pos: Tensor | None = None
    ) -> Tensor:
        """x (B, S, C), src_key_mask (B, S) True = real, pos (B, S, C) -> memory (B, S, C)."""
        mask = _key_mask(src_key_mask, x)
        for layer in self.layers:
            x = layer(x, mask=mask, pos=pos)
        return self.norm(x)


class DetrDecoder(nn.Module):
    """A stack of non-causal `DecoderBlock`s with DETR's positions and final LayerNorm.

    `return_intermediate`: return every layer's output, each through the final
    norm, stacked (L, B, Q, C) — DETR's auxiliary decoding losses (§3.2) use them;
    otherwise (1, B, Q, C). Either way `[-1]` is the decoder output.
    """

    def __init__(
        self, layers: list[DecoderBlock], norm: nn.Module, *, return_intermediate: bool = False
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.return_intermediate = return_intermediate

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        memory_key_mask: Tensor | None = None,
        pos: Tensor | None = None,
        query_pos: Tensor | None = None,
    ) -> Tensor:
        """tgt (B, Q, C), memory (B, S, C) -> (L or 1, B, Q, C).

        memory_key_mask: (B, S) True = real pixel. pos: memory positions (B, S, C).
        query_pos: object-query positions (B, Q, C) or (1, Q, C).
        """
        memory_mask = _key_mask(memory_key_mask, memory)
        x, outputs = tgt, []
        for layer in self.layers:
            x = layer(x, memory, memory_mask=memory_mask, pos=pos, query_pos=query_pos)
            if self.return_intermediate:
                outputs.append(self.norm(x))  # the stream itself stays un-normalised
        if not self.return_intermediate:
            outputs.append(self.norm(x))
        return torch.stack(outputs)  # (L or 1, B, Q, C)


class DetrTransformer(nn.Module):
    """DETR's encoder-decoder with learned object queries.

    Args:
        d_model, nhead, dim_ff: C, H and F (DETR: 256, 8, 2048).
        enc_layers, dec_layers: encoder and decoder depth (DETR: 6, 6).
        dropout: on every sublayer output, after the ReLU, and on the attention
            probabilities (DETR uses one rate, 0.1).
        num_queries: Q, the number of object slots (DETR: 100).
        norm_first: pre-norm (DETR's `--pre_norm`; adds a final encoder norm).
        return_intermediate: the decoder returns all L layers' outputs.
        device, dtype: of the parameters, as for `torch.nn.Linear`.

    Parameters: `encoder` (`DetrEncoder`), `decoder` (`DetrDecoder`),
    `query_embed` (Q, C) — the object queries, used as `query_pos`.
    Weights start at torch's defaults; DETR re-draws every matrix with
    `nn.init.xavier_uniform_` before training.
    """

    def __init__(
        self,
        d_model: int = 256,
        nhead: int = 8,
        enc_layers: int = 6,
        dec_layers: int = 6,
        dim_ff: int = 2048,
        dropout: float = 0.1,
        num_queries: int = 100,
        *,
        norm_first: bool = False,
        norm_eps: float = 1e-5,
        return_intermediate: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        for name, value in (("d_model", d_model), ("nhead", nhead), ("dim_ff", dim_ff)):
            positive_int(name, value)
        positive_int("enc_layers", enc_layers), positive_int("dec_layers", dec_layers)
        if d_model % nhead:
            raise ValueError(f"d_model={d_model} must be divisible by nhead={nhead}")
        num_queries = positive_int("num_queries", num_queries)
        # DecoderBlock reads its sizes from a TransformerConfig; DETR has no vocabulary.
        cfg = TransformerConfig(
            src_vocab=1,
            tgt_vocab=1,
            d_model=d_model,
            num_heads=nhead,
            d_ff=dim_ff,
            dropout=probability("dropout", dropout),
            attn_dropout=dropout,
            norm_first=norm_first,
            activation="relu",
            norm_eps=norm_eps,
        )
        self.d_model, self.num_queries = d_model, num_queries
        enc = [
            EncoderBlock(
                d_model,
                nhead,
                dim_ff,
                norm_first=norm_first,
                dropout=dropout,
                attn_dropout=dropout,
                activation="relu",
                norm_eps=norm_eps,
                **fk,
            )
            for _ in range(enc_layers)
        ]
        enc_norm = nn.LayerNorm(d_model, eps=norm_eps, **fk) if norm_first else None
        self.encoder = DetrEncoder(enc, enc_norm)
        dec = [DecoderBlock(cfg, causal=False, **fk) for _ in range(dec_layers)]
        dec_norm = nn.LayerNorm(d_model, eps=norm_eps, **fk)
        self.decoder = DetrDecoder(dec, dec_norm, return_intermediate=return_intermediate)
        self.query_embed = nn.Embedding(num_queries, d_model, **fk)

    def forward(
        self, src: Tensor, src_key_mask: Tensor | None = None, pos: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """src (B, S, C) flattened feature map, src_key_mask (B, S) True = real pixel,
        pos (B, S, C) its positions -> (decoder output (L or 1, B, Q, C), memory (B, S, C)).

        The decoder output is (L, B, Q, C) with `return_intermediate`, else (1, B, Q, C):
        DETR's `hs`, batch first; `[-1]` feeds the class and box heads.
        """
        if not isinstance(src, Tensor) or src.dim() != 3 or src.shape[-1] != self.d_model:
            got = tuple(src.shape) if isinstance(src, Tensor) else type(src).__name__
            raise ValueError(f"src must have shape (B, S, {self.d_model}), got {got}")
        if pos is not None and (pos.dim() != 3 or pos.shape[1:] != src.shape[1:]):
            raise ValueError(
                f"pos must have shape (B, S, C) = {tuple(src.shape)}, got {tuple(pos.shape)}"
            )
        memory = self.encoder(src, src_key_mask=src_key_mask, pos=pos)
        query_pos = self.query_embed.weight[None].expand(src.shape[0], -1, -1)  # (B, Q, C)
        tgt = torch.zeros_like(query_pos)  # (B, Q, C): queries start as positions only
        out = self.decoder(tgt, memory, memory_key_mask=src_key_mask, pos=pos, query_pos=query_pos)
        return out, memory
