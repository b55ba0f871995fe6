"""`torch.nn.TransformerDecoderLayer` <-> `attnkit.models.DecoderBlock`.

| torch.nn.TransformerDecoderLayer       | attnkit.models.DecoderBlock              |
| -------------------------------------- | ---------------------------------------- |
| self_attn.in_proj_weight / _bias       | self_attn.fn.in_proj.qkv.weight / .bias  |
| self_attn.out_proj.weight / .bias      | self_attn.fn.proj.weight / .bias         |
| multihead_attn.in_proj_weight / _bias  | cross_attn.fn.in_proj.qkv.weight / .bias |
|   (3C, C): q rows, then k, then v      |   (q from x, k and v from memory)        |
| multihead_attn.out_proj.weight / .bias | cross_attn.fn.proj.weight / .bias        |
| norm1.*, norm2.*, norm3.* (C,)         | self_attn.norm.*, cross_attn.norm.*, ff.norm.* |
| linear1.*, linear2.*                   | ff.fn.fc1.*, ff.fn.fc2.*                 |

`DecoderBlock` takes a `TransformerConfig`; `decoder_config_from_torch`
builds the matching one (vocabularies 1: the layer has no embeddings).
Dropouts: `dropout1/2/3` ↔ `self_attn.drop`/`cross_attn.drop`/`ff.drop`,
`dropout` ↔ `ff.fn.drop`, the two attentions' `dropout` ↔ `*.fn.attend.dropout`.
A sequence-first layer (`batch_first=False`) is refused unless `batch_first=True`
acknowledges that the block reads (B, T, C) (see `torch_nn`).
`DecoderBlock` is always causal; torch's layer is causal only when given
`tgt_mask` (or `tgt_is_causal` with a mask). `decoder_masks_from_torch`
converts the four torch masks and refuses a `tgt_mask` that is not causal.

A query row that may attend to nothing (its own key is padding under the
causal mask, or its memory is all padding): attnkit gives attention output
0. torch (2.13) `TransformerDecoderLayer` has no fast path and gives the
same, no NaN (tested).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.convert._state import load_by_table, load_exact
from attnkit.convert.torch_nn import check_batch_first
from attnkit.convert.torch_transformer import (
    _activation_from_torch,
    _activation_to_torch,
    _check_layer,
    _dropout,
    _p,
)
from attnkit.functional import masks as _masks
from attnkit.models.decoding import CachedMultiHeadAttention
from attnkit.models.transformer import DecoderBlock, TransformerConfig
from attnkit.modules.blocks import FeedForward, PreNormResidual

__all__ = [
    "DECODER_TABLE",
    "decoder_config_from_torch",
    "decoder_from_torch",
    "decoder_masks_from_torch",
    "decoder_to_torch",
    "load_torch_decoder_state",
]

DECODER_TABLE = {
    "self_attn.in_proj_weight": "self_attn.fn.in_proj.qkv.weight",
    "self_attn.in_proj_bias": "self_attn.fn.in_proj.qkv.bias",
    "self_attn.out_proj.weight": "self_attn.fn.proj.weight",
    "self_attn.out_proj.bias": "self_attn.fn.proj.bias",
    "multihead_attn.in_proj_weight": "cross_attn.fn.in_proj.qkv.weight",
    "multihead_attn.in_proj_bias": "cross_attn.fn.in_proj.qkv.bias",
    "multihead_attn.out_proj.weight": "cross_attn.fn.proj.weight",
    "multihead_attn.out_proj.bias": "cross_attn.fn.proj.bias",
    "norm1.weight": "self_attn.norm.weight",
    "norm1.bias": "self_attn.norm.bias",
    "norm2.weight": "cross_attn.norm.weight",
    "norm2.bias": "cross_attn.norm.bias",
    "linear1.weight": "ff.fn.fc1.weight",
    "linear1.bias": "ff.fn.fc1.bias",
    "linear2.weight": "ff.fn.fc2.weight",
    "linear2.bias": "ff.fn.fc2.bias",
    "norm3.weight": "ff.norm.weight",
    "norm3.bias": "ff.norm.bias",
}


def load_torch_decoder_state(block: DecoderBlock, state: dict[str, Tensor]) -> DecoderBlock:
    """Copy a `TransformerDecoderLayer` state dict into `block`, exactly; returns `block`.

    Raises ValueError naming every missing, unexpected or mis-shaped key.
    """
    return load_by_table(block, state, DECODER_TABLE, source="load_torch_decoder_state")


def decoder_config_from_torch(layer: nn.TransformerDecoderLayer) -> TransformerConfig:
    """The `TransformerConfig` of a one-block decoder with `layer`'s sizes and settings.

    The vocabularies (which the layer has not) are 1; `activation` is "relu"
    when the layer's is a module (`decoder_from_torch` copies the module).
    """
    act = _activation_from_torch(layer.activation)
    return TransformerConfig(
        src_vocab=1,
        tgt_vocab=1,
        d_model=layer.linear1.in_features,
        num_heads=layer.self_attn.num_heads,
        d_ff=layer.linear1.out_features,
        encoder_layers=0,
        decoder_layers=1,
        dropout=layer.dropout.p,
        attn_dropout=layer.self_attn.dropout,
        norm_first=layer.norm_first,
        activation=act if isinstance(act, str) else "relu",
        norm_eps=layer.norm1.eps,
    )


def decoder_from_torch(
    layer: nn.TransformerDecoderLayer, *, batch_first: bool | None = None
) -> DecoderBlock:
    """An `attnkit.models.DecoderBlock` with exactly the weights and settings of `layer`.

    The block reads (B, T, C): a sequence-first `layer` is refused (ValueError naming
    `batch_first`) unless `batch_first=True` says you will transpose its inputs.
    """
    if not isinstance(layer, nn.TransformerDecoderLayer):
        raise ValueError(f"expected torch.nn.TransformerDecoderLayer, got {type(layer).__name__}")
    check_batch_first("nn.TransformerDecoderLayer", layer.self_attn.batch_first, batch_first)
    for name, m in (("self_attn", layer.self_attn), ("multihead_attn", layer.multihead_attn)):
        if m.bias_k is not None or m.add_zero_attn or not m._qkv_same_embed_dim:
            raise ValueError(f"from_torch: {name} with add_bias_kv/add_zero_attn/kdim")
    cfg = decoder_config_from_torch(layer)
    block = DecoderBlock(cfg)
    c, hidden, eps = cfg.d_model, cfg.d_ff, cfg.norm_eps
    act = _activation_from_torch(layer.activation)
    if not isinstance(act, str):
        block.ff.fn.act = act
    bias = layer.linear1.bias is not None
    if not bias:  # torch's bias=False drops every bias, LayerNorms included
        for sub, m in (
            (block.self_attn, layer.self_attn),
            (block.cross_attn, layer.multihead_attn),
        ):
            sub.fn = CachedMultiHeadAttention(
                c, cfg.num_heads, qkv_bias=False, out_bias=False, dropout=m.dropout
            )
        block.ff.fn = FeedForward(c, hidden, activation=block.ff.fn.act, bias=False)
        for sub in (block.self_attn, block.cross_attn, block.ff):
            sub.norm = nn.LayerNorm(c, eps=eps, bias=False)
    block.cross_attn.fn.attend.dropout = layer.multihead_attn.dropout
    block.self_attn.drop, block.cross_attn.drop, block.ff.drop = (
        _dropout(d.p) for d in (layer.dropout1, layer.dropout2, layer.dropout3)
    )
    block.ff.fn.drop = _dropout(layer.dropout.p)
    ref = layer.linear1.weight
    block = block.to(device=ref.device, dtype=ref.dtype)
    block._torch_batch_first = bool(layer.self_attn.batch_first)  # read by decoder_to_torch
    return load_torch_decoder_state(block, {k: v.detach() for k, v in layer.state_dict().items()})


def decoder_to_torch(
    block: DecoderBlock, *, batch_first: bool | None = None
) -> nn.TransformerDecoderLayer:
    """A `torch.nn.TransformerDecoderLayer` with exactly the weights and settings of `block`.

    `batch_first` defaults to the layout of the layer `block` came from (True for a block
    built in attnkit).

    torch applies no causal mask by itself: call the layer with
    `tgt_mask=nn.Transformer.generate_square_subsequent_mask(T)` (a DecoderBlock
    masks causally unless built with `causal=False`, as DETR's decoder is).
    """
    if batch_first is None:
        batch_first = getattr(block, "_torch_batch_first", True)
    if block.cross_attn is None:
        raise ValueError("to_torch: TransformerDecoderLayer needs a block with cross-attention")
    subs = (block.self_attn, block.cross_attn, block.ff)
    attns, ff = [block.self_attn.fn, block.cross_attn.fn], block.ff.fn
    norms = tuple(s.norm for s in subs)
    (sa, ca), bias = _check_layer("TransformerDecoderLayer", attns, ff, norms)
    ref = ff.fc1.weight
    layer = nn.TransformerDecoderLayer(
        ff.fc1.in_features,
        sa.num_heads,
        ff.fc1.out_features,
        activation=_activation_to_torch(ff.act),
        layer_norm_eps=norms[0].eps,
        batch_first=batch_first,
        norm_first=isinstance(block.self_attn, PreNormResidual),
        bias=bias,
        device=ref.device,
        dtype=ref.dtype,
    )
    layer.self_attn.dropout, layer.multihead_attn.dropout = sa.dropout, ca.dropout
    for d, p in zip(
        (layer.dropout1, layer.dropout2, layer.dropout3, layer.dropout),
        (*(_p(s.drop) for s in subs), _p(ff.drop)),
        strict=True,
    ):
        d.p = p
    inverse = {v: k for k, v in DECODER_TABLE.items()}
    state = {inverse[k]: v.detach() for k, v in block.state_dict().items()}
    load_exact(layer, state, source="to_torch")
    return layer


def _torch_bool(name: str, m: Tensor) -> Tensor:
    """A torch mask as boolean with torch's polarity (True = blocked; float: -inf = blocked)."""
    if not m.dtype.is_floating_point:
        return m
    if not bool(((m == 0) | torch.isneginf(m)).all()):
        raise ValueError(
            f"{name}: a float mask with values other than 0 and -inf is a bias; "
            "the blocks take boolean masks only"
        )
    return torch.isneginf(m)


def _blocked(name: str, m: Tensor, num_heads: int | None) -> Tensor:
    """torch attn mask → boolean (1, 1, T, ·) or (B, H, T, ·), True = blocked."""
    return ~_masks.from_torch_attn_mask(_torch_bool(name, m), num_heads)


def decoder_masks_from_torch(
    *,
    tgt_mask: Tensor | None = None,
    memory_mask: Tensor | None = None,
    tgt_key_padding_mask: Tensor | None = None,
    memory_key_padding_mask: Tensor | None = None,
    tgt_is_causal: bool = False,
    num_heads: int | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """torch's four decoder masks → `(mask, memory_mask)` for `DecoderBlock.forward`.

    Each result is boolean, True = may attend, broadcastable to (B, H, T, T)
    and (B, H, T, S), or None. torch's boolean masks mean True = *ignore*;
    float masks must hold only 0 and -inf. `DecoderBlock` is always causal, so
    `tgt_mask` must block every key j > i (`generate_square_subsequent_mask`
    does); with `tgt_mask=None` pass `tgt_is_causal=True` to say you mean causal.
    3-D masks (B·H, T, ·) need `num_heads`.
    """
    parts = []
    if tgt_mask is None and not tgt_is_causal:
        raise ValueError(
            "tgt_mask=None is not causal in torch, but DecoderBlock always is: pass "
            "nn.Transformer.generate_square_subsequent_mask(T) or tgt_is_causal=True"
        )
    if tgt_mask is not None:
        blocked = _blocked("tgt_mask", tgt_mask, num_heads)
        t = blocked.shape[-1]
        future = torch.ones(t, t, dtype=torch.bool, device=blocked.device).triu(1)
        if not bool(blocked[..., future].all()):
            raise ValueError(
                f"tgt_mask {tuple(tgt_mask.shape)} lets a query see a later key; "
                "DecoderBlock is always causal and cannot"
            )
        if not torch.equal(blocked, future.expand_as(blocked)):
            parts.append(~blocked)  # more than causal: keep it
    if tgt_key_padding_mask is not None:
        parts.append(_masks.from_torch_key_padding_mask(_bool(tgt_key_padding_mask)))
    mem = [] if memory_mask is None else [~_blocked("memory_mask", memory_mask, num_heads)]
    if memory_key_padding_mask is not None:
        mem.append(_masks.from_torch_key_padding_mask(_bool(memory_key_padding_mask)))
    return _masks.combine(*parts), _masks.combine(*mem)


def _bool(key_padding_mask: Tensor) -> Tensor:
    """A key-padding mask with torch's polarity as boolean (float: -inf = padding)."""
    return _torch_bool("key_padding_mask", key_padding_mask)
