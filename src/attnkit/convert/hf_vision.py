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

Model level — a `ViTModel` (or `ViTForImageClassification`) is an
`attnkit.models.vit.ViT` with `cls_pos=True` (one position table for the class
token and the patches), `norm_eps`, `qkv_bias`, and `pooler=True` when HF has
its pooler (dense + tanh on the class token); `num_classes=0` (no head) for a
`ViTModel`:

| HF ViTModel                                  | attnkit ViT                     |
| -------------------------------------------- | ------------------------------- |
| embeddings.cls_token (1, 1, C)               | cls_token (1, 1, C)             |
| embeddings.position_embeddings (1, 1 + N, C) | pos.weight (1 + N, C)           |
| embeddings.patch_embeddings.projection.*     | embed.proj.* (Linear (C, Ci·P²) |
|   (Conv2d weight (C, Ci, P, P))              |   = conv weight.flatten(1))     |
| layers.{i}.* (table above)                   | blocks.{i}.*                    |
| layernorm.*                                  | norm.*                          |
| pooler.dense.*                               | pooler.0.*                      |
| (ViTForImageClassification: vit.… above,     | head.*                          |
|  classifier.*)                               |                                 |

HF's `last_hidden_state` is `ViT.features(images)`, its `pooler_output` (or
the classifier's logits) is `ViT(images)`. A whole `SwinModel` (stages with
patch merging) converts in `attnkit.convert.hf_swin`, using the layer table above.

Differences (documented and tested):
* HF Swin pads a grid that is not a multiple of the window M with zero tokens
  *that are attended to* (after the LayerNorm; their keys and values are the
  projection biases); attnkit's `WindowAttention` masks padded keys out by
  default. `swin_block_from_hf` sets `pad_attends=True` to give HF's numbers;
  pass `pad_attends=False` for attnkit's masking (then outputs agree only on
  grids that are multiples of M).
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
    "VIT_MODEL_TABLE",
    "hf_swin_layer_state",
    "hf_vit_layer_state",
    "hf_vit_model_state",
    "load_hf_vit_layer_state",
    "load_hf_vit_model_state",
    "swin_block_from_hf",
    "vit_block_from_hf",
    "vit_config_from_hf",
    "vit_from_hf",
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

# attnkit ViT name -> HF ViTModel name (the layers follow VIT_LAYER_TABLE under layers.{i})
VIT_MODEL_TABLE: dict[str, str] = {
    "cls_token": "embeddings.cls_token",
    "pos.weight": "embeddings.position_embeddings",
    "embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
    "embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
    "norm.weight": "layernorm.weight",
    "norm.bias": "layernorm.bias",
    "pooler.0.weight": "pooler.dense.weight",
    "pooler.0.bias": "pooler.dense.bias",
    "head.weight": "classifier.weight",  # ViTForImageClassification (names there: vit.…)
    "head.bias": "classifier.bias",
}


def _peer_shapes(
    ours: Mapping[str, Tensor], table, shapes: Mapping[str, Shape] | None = None
) -> dict[str, Shape]:
    """HF name -> the shape HF gives it: a row block of ours, or `shapes[name]` (a reshape)."""
    wanted: dict[str, Shape] = {}
    for name, t in ours.items():
        if name not in table:
            raise ValueError(f"no Hugging Face name for attnkit parameter {name!r}")
        sources = table[name]
        for src in sources:
            wanted[src] = (t.shape[0] // len(sources), *t.shape[1:])
    return wanted | dict(shapes or {})


def _load_table(
    module: nn.Module, state: Mapping[str, Tensor], table, source: str, shapes=None
) -> nn.Module:
    ours = module.state_dict()
    check_state(state, _peer_shapes(ours, table, shapes), source=source)
    new = {
        name: torch.cat([state[s] for s in table[name]]).reshape(t.shape)
        for name, t in ours.items()
    }
    return load_exact(module, new, source=source)


def _dump_table(module: nn.Module, table, shapes=None) -> dict[str, Tensor]:
    wanted = _peer_shapes(module.state_dict(), table, shapes)
    out = {}
    for name, t in module.state_dict().items():
        sources = table[name]
        for src, part in zip(sources, t.detach().chunk(len(sources)), strict=True):
            out[src] = part.reshape(wanted[src]).clone()
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


def _vit_model_table(vit: nn.Module) -> tuple[dict[str, tuple[str, ...]], dict[str, Shape]]:
    """attnkit ViT name -> HF name(s), and HF's shapes where they differ from a row split.

    A ViT with a head is ViTForImageClassification's (names under `vit.`).
    """
    cfg = vit.config
    if cfg.tokens != "patch" or not cfg.cls_pos:
        raise ValueError("Hugging Face's ViT has patch tokens and a class token with a position")
    prefix = "vit." if cfg.num_classes else ""
    table = {
        ours: (theirs if ours.startswith("head.") else prefix + theirs,)
        for ours, theirs in VIT_MODEL_TABLE.items()
    }
    for i in range(len(vit.blocks)):
        for ours, theirs in VIT_LAYER_TABLE.items():
            table[f"blocks.{i}.{ours}"] = tuple(f"{prefix}layers.{i}.{t}" for t in theirs)
    c, p = cfg.dim, cfg.patch_size
    shapes = {  # HF: a (1, 1 + N, C) table and a Conv2d; attnkit: (1 + N, C) and a Linear
        prefix + "embeddings.position_embeddings": (1, *vit.pos.weight.shape),
        prefix + "embeddings.patch_embeddings.projection.weight": (c, cfg.in_chans, p, p),
    }
    return table, shapes


def load_hf_vit_model_state(vit: nn.Module, state: Mapping[str, Tensor]) -> nn.Module:
    """Copy a `ViTModel` (headless `vit`) or `ViTForImageClassification` state dict, exactly.

    The patch Conv2d weight (C, Ci, P, P) becomes the Linear weight (C, Ci·P²)
    of attnkit's hard split (nn.Unfold flattens a patch in the same c, y, x
    order). Raises ValueError naming every missing, unexpected or mis-shaped key.
    """
    table, shapes = _vit_model_table(vit)
    return _load_table(vit, state, table, "load_hf_vit_model_state", shapes)


def hf_vit_model_state(vit: nn.Module) -> dict[str, Tensor]:
    """`vit`'s weights under HF names (load with `model.load_state_dict(..., strict=True)`)."""
    return _dump_table(vit, *_vit_model_table(vit))


def vit_config_from_hf(config, *, pooler: bool, num_classes: int = 0):
    """The `attnkit.models.vit.ViTConfig` of an HF `ViTConfig` (refuses what ViT cannot hold)."""
    from attnkit.models.vit import ViTConfig

    c, hidden = config.hidden_size, config.intermediate_size
    problems = []
    sizes = {"image_size": config.image_size, "patch_size": config.patch_size}
    for name, v in sizes.items():
        if not isinstance(v, int):
            problems.append(f"{name}={v!r} is not one int (attnkit's ViT is square)")
    if config.hidden_act != "gelu":
        problems.append(f"hidden_act={config.hidden_act!r} (attnkit's ViT uses gelu)")
    ratio = hidden / c
    if int(c * ratio) != hidden:
        problems.append(f"intermediate_size={hidden} is not int(hidden_size · ratio)")
    if pooler and getattr(config, "pooler_act", "tanh") != "tanh":
        problems.append(f"pooler_act={config.pooler_act!r} (attnkit's pooler is tanh)")
    if pooler and getattr(config, "pooler_output_size", None) not in (None, c):
        problems.append(f"pooler_output_size={config.pooler_output_size} != hidden_size={c}")
    if problems:
        raise ValueError("vit_from_hf: attnkit's ViT cannot express " + "; ".join(problems))
    return ViTConfig(
        image_size=config.image_size,
        in_chans=config.num_channels,
        num_classes=num_classes,
        patch_size=config.patch_size,
        dim=c,
        depth=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        mlp_ratio=ratio,
        pool="cls",
        pos="learned",
        dropout=config.hidden_dropout_prob,
        attn_dropout=config.attention_probs_dropout_prob,
        norm_eps=config.layer_norm_eps,
        qkv_bias=getattr(config, "qkv_bias", True),
        cls_pos=True,
        pooler=pooler,
    )


def vit_from_hf(model: nn.Module) -> nn.Module:
    """An `attnkit.models.vit.ViT` equal to an HF `ViTModel` or `ViTForImageClassification`.

    `ViT.features(x)` is HF's `last_hidden_state`; `ViT(x)` its `pooler_output`
    (ViTModel with pooler), `last_hidden_state[:, 0]` (without) or `logits`.
    """
    from attnkit.models.vit import ViT

    classifier = getattr(model, "classifier", None)
    body = model.vit if classifier is not None else model
    if not hasattr(body, "embeddings") or not hasattr(body, "layers"):
        raise ValueError(f"expected a transformers ViTModel, got {type(model).__name__}")
    k = getattr(classifier, "out_features", 0)
    if classifier is not None and not k:
        raise ValueError("vit_from_hf: a classifier without labels; convert model.vit instead")
    cfg = vit_config_from_hf(model.config, pooler=body.pooler is not None, num_classes=k)
    ref = next(model.parameters())
    vit = ViT(cfg).to(device=ref.device, dtype=ref.dtype)
    return load_hf_vit_model_state(vit, {k: v.detach() for k, v in model.state_dict().items()})


# --------------------------------------------------------------------------- Swin


def hf_swin_layer_state(block: nn.Module) -> dict[str, Tensor]:
    """A `SwinBlock`'s weights under HF `SwinLayer` names (load with `layer.load_state_dict`)."""
    return _dump_table(block, SWIN_LAYER_TABLE)


def swin_block_from_hf(
    layer: nn.Module, config, *, grid: tuple[int, int], pad_attends: bool = True
) -> nn.Module:
    """An `attnkit.vision.SwinBlock` equal to an HF `SwinLayer` run on an H × W `grid`.

    HF turns the shift off when min(H, W) <= M (and shrinks the window below
    M, which its bias table cannot follow: refused here). `pad_attends=True`
    attends to the zero padding of a grid that is not a multiple of M, as HF
    does; False masks it (attnkit's default for its own blocks).
    """
    from attnkit.vision.window import SwinBlock

    c = layer.layernorm_before.normalized_shape[0]
    heads = layer.attention.relative_position_bias.relative_position_bias_table.shape[1]
    m, shift = config.window_size, int(layer.shift_size)
    if min(grid) < m:
        raise ValueError(f"swin_block_from_hf: grid {grid} is smaller than the window {m}")
    if min(grid) == m:
        shift = 0
    block = SwinBlock(
        c, heads, m, shift=int(shift), mlp_ratio=config.mlp_ratio, pad_attends=pad_attends
    )
    for norm in (block.attn.norm, block.ff.norm):
        norm.eps = config.layer_norm_eps
    ref = next(layer.parameters())
    block = block.to(device=ref.device, dtype=ref.dtype)
    return _load_table(block, layer.state_dict(), SWIN_LAYER_TABLE, "swin_block_from_hf")
