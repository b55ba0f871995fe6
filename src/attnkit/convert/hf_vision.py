"""Hugging Face vision transformers (ViT, Swin; transformers 5.x names) <-> attnkit.

Per layer — a `ViTLayer` is a pre-norm `attnkit.EncoderBlock` (gelu, LayerNorm
eps = `config.layer_norm_eps`), a `SwinLayer` an `attnkit.vision.SwinBlock`:

| HF ViTLayer / SwinLayer (relative)  | attnkit EncoderBlock / SwinBlock           |
| ------------------------------------ | ------------------------------------------ |
| attention.{q,k,v}_proj.weight (C, C) | attn.fn[.attn].in_proj.qkv.weight (3C, C)  |
|                                      | (q rows, then k, then v)                   |
| attention.{q,k,v}_proj.bias (C,)     | attn.fn[.attn].in_proj.qkv.bias (3C,)      |
| attention.o_proj.weight, .bias       | attn.fn[.attn].proj.weight, .bias          |
| attention.relative_position_bias.    | attn.fn.bias_table (Swin only)             |
|   relative_position_bias_table       |   ((2M-1)², Hh)                            |
| layernorm_before.weight, .bias       | attn.norm.weight, .bias                    |
| layernorm_after.weight, .bias        | ff.norm.weight, .bias                      |
| mlp.fc1.*, mlp.fc2.*                 | ff.fn.fc1.*, ff.fn.fc2.*                   |

Swin's relative position index is the same formula on both sides
((yi - yj + M - 1)(2M - 1) + xi - xj + M - 1), so the table is copied as is.

Model level (ViTModel: embeddings.cls_token, embeddings.position_embeddings,
embeddings.patch_embeddings.projection.*, layers.{i}.*, layernorm.*,
pooler.dense.*; SwinModel: embeddings.patch_embeddings.projection.*,
embeddings.norm.*, encoder.layers.{s}.blocks.{i}.*,
encoder.layers.{s}.downsample.reduction.weight / .norm.*, layernorm.*) waits
for attnkit's ViT and Swin models; `VIT_MODEL_PREFIXES` records the HF side.

Differences (documented, tested where the modules exist):
* HF Swin pads a grid that is not a multiple of the window M with zero tokens
  *that are attended to* (after the LayerNorm; their keys and values are the
  projection biases); attnkit's `WindowAttention` masks padded keys out, so
  outputs agree only on grids that are multiples of M.
* HF Swin blocks a shifted-window pair by adding -100.0 to its score
  (weight ~e^-100); attnkit blocks it exactly (weight 0).
* HF Swin turns the shift off when min(H, W) <= M; `swin_block_from_hf`
  takes the grid to do the same.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from attnkit.convert._state import Shape, check_state, load_exact
from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.blocks import EncoderBlock

__all__ = [
    "SWIN_LAYER_TABLE",
    "VIT_LAYER_TABLE",
    "VIT_MODEL_PREFIXES",
    "hf_swin_layer_state",
    "hf_vit_layer_state",
    "load_hf_vit_layer_state",
    "swin_block_from_hf",
    "vit_block_from_hf",
]

# attnkit name -> the HF name(s) it is made of (several are concatenated on dim 0)
VIT_LAYER_TABLE: dict[str, tuple[str, ...]] = {
    "attn.fn.in_proj.qkv.weight": tuple(f"attention.{p}_proj.weight" for p in "qkv"),
    "attn.fn.in_proj.qkv.bias": tuple(f"attention.{p}_proj.bias" for p in "qkv"),
    "attn.fn.proj.weight": ("attention.o_proj.weight",),
    "attn.fn.proj.bias": ("attention.o_proj.bias",),
    "attn.norm.weight": ("layernorm_before.weight",),
    "attn.norm.bias": ("layernorm_before.bias",),
    "ff.norm.weight": ("layernorm_after.weight",),
    "ff.norm.bias": ("layernorm_after.bias",),
    "ff.fn.fc1.weight": ("mlp.fc1.weight",),
    "ff.fn.fc1.bias": ("mlp.fc1.bias",),
    "ff.fn.fc2.weight": ("mlp.fc2.weight",),
    "ff.fn.fc2.bias": ("mlp.fc2.bias",),
}

SWIN_LAYER_TABLE: dict[str, tuple[str, ...]] = {
    k.replace("attn.fn.", "attn.fn.attn.") if k.startswith("attn.fn.") else k: v
    for k, v in VIT_LAYER_TABLE.items()
} | {
    "attn.fn.bias_table": ("attention.relative_position_bias.relative_position_bias_table",),
}

VIT_MODEL_PREFIXES = {
    "cls_token": "embeddings.cls_token",
    "pos_embed": "embeddings.position_embeddings",
    "patch_embed": "embeddings.patch_embeddings.projection",
    "layers": "layers.{i}",
    "norm": "layernorm",
    "pooler": "pooler.dense",
}


def _peer_shapes(ours: Mapping[str, Tensor], table) -> dict[str, Shape]:
    wanted: dict[str, Shape] = {}
    for name, t in ours.items():
        if name not in table:
            raise ValueError(f"no Hugging Face name for attnkit parameter {name!r}")
        sources = table[name]
        for src in sources:
            wanted[src] = (t.shape[0] // len(sources), *t.shape[1:])
    return wanted


def _load_table(module: nn.Module, state: Mapping[str, Tensor], table, source: str) -> nn.Module:
    ours = module.state_dict()
    check_state(state, _peer_shapes(ours, table), source=source)
    new = {name: torch.cat([state[s] for s in table[name]]) for name in ours}
    return load_exact(module, new, source=source)


def _dump_table(module: nn.Module, table) -> dict[str, Tensor]:
    out = {}
    for name, t in module.state_dict().items():
        sources = table[name]
        for src, part in zip(sources, t.detach().chunk(len(sources)), strict=True):
            out[src] = part.clone()
    return out


# --------------------------------------------------------------------------- ViT


def load_hf_vit_layer_state(block: EncoderBlock, state: Mapping[str, Tensor]) -> EncoderBlock:
    """Copy one HF `ViTLayer`'s state dict (names relative to the layer) into `block`, exactly."""
    return _load_table(block, state, VIT_LAYER_TABLE, "load_hf_vit_layer_state")


def hf_vit_layer_state(block: EncoderBlock) -> dict[str, Tensor]:
    """`block`'s weights under HF `ViTLayer` names (load with `layer.load_state_dict`)."""
    return _dump_table(block, VIT_LAYER_TABLE)


def _act(config) -> str:
    act = getattr(config, "hidden_act", "gelu")
    if act not in ("gelu", "relu", "silu"):
        raise ValueError(f"hidden_act={act!r} has no attnkit activation name here")
    return act


def vit_block_from_hf(layer: nn.Module, config) -> EncoderBlock:
    """An `attnkit.EncoderBlock` (pre-norm) equal to an HF `ViTLayer` built from `config`."""
    c, h = config.hidden_size, config.num_attention_heads
    bias = getattr(config, "qkv_bias", True)
    block = EncoderBlock(
        c,
        h,
        config.intermediate_size,
        norm_first=True,
        activation=_act(config),
        norm_eps=config.layer_norm_eps,
        attn=MultiHeadAttention(c, h, qkv_bias=bias, dropout=config.attention_probs_dropout_prob),
    )
    ref = next(layer.parameters())
    block = block.to(device=ref.device, dtype=ref.dtype)
    return load_hf_vit_layer_state(block, layer.state_dict())


# --------------------------------------------------------------------------- Swin


def hf_swin_layer_state(block: nn.Module) -> dict[str, Tensor]:
    """A `SwinBlock`'s weights under HF `SwinLayer` names (load with `layer.load_state_dict`)."""
    return _dump_table(block, SWIN_LAYER_TABLE)


def swin_block_from_hf(layer: nn.Module, config, *, grid: tuple[int, int]) -> nn.Module:
    """An `attnkit.vision.SwinBlock` equal to an HF `SwinLayer` run on an H × W `grid`.

    HF turns the shift off when min(H, W) <= M (and shrinks the window below
    M, which its bias table cannot follow: refused here).
    """
    from attnkit.vision.window import SwinBlock

    c = layer.layernorm_before.normalized_shape[0]
    heads = layer.attention.relative_position_bias.relative_position_bias_table.shape[1]
    m, shift = config.window_size, int(layer.shift_size)
    if min(grid) < m:
        raise ValueError(f"swin_block_from_hf: grid {grid} is smaller than the window {m}")
    if min(grid) == m:
        shift = 0
    block = SwinBlock(c, heads, m, shift=int(shift), mlp_ratio=config.mlp_ratio)
    for norm in (block.attn.norm, block.ff.norm):
        norm.eps = config.layer_norm_eps
    ref = next(layer.parameters())
    block = block.to(device=ref.device, dtype=ref.dtype)
    return _load_table(block, layer.state_dict(), SWIN_LAYER_TABLE, "swin_block_from_hf")
