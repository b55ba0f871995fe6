"""Hugging Face `SwinModel` (transformers 5.x names) <-> `attnkit.vision.SwinModel`.

| HF SwinModel                                    | attnkit SwinModel                        |
| ----------------------------------------------- | ---------------------------------------- |
| embeddings.patch_embeddings.projection.weight   | embed.proj.weight (C, Ci·P²)             |
|   (Conv2d (C, Ci, P, P))                        |   = conv weight.flatten(1)               |
| embeddings.patch_embeddings.projection.bias     | embed.proj.bias                          |
| embeddings.norm.*                               | embed_norm.*                             |
| embeddings.position_embeddings (1, N, C)        | pos (1, N, C), with `absolute_pos`       |
| encoder.layers.{s}.blocks.{i}.* (SwinLayer)     | stages.{s}.blocks.{i}.* (SwinBlock; the  |
|                                                 |   layer table of `convert.hf_vision`)    |
| encoder.layers.{s}.downsample.norm.*            | stages.{s}.downsample.norm.*             |
| encoder.layers.{s}.downsample.reduction.weight  | stages.{s}.downsample.reduction.weight   |
| layernorm.*                                     | norm.*                                   |
| pooler (AdaptiveAvgPool1d, no weights)          | `pool=True` (mean over tokens)           |

HF's `last_hidden_state` is `SwinModel.features(x)`, its `pooler_output` is
`SwinModel(x)`, its `hidden_states` are `SwinModel.stage_maps(x)` flattened to
(B, H·W, C). HF's `attentions` hold each stage's last block; attnkit's
`record_attention` gives every block's, in the same (B·nW, Hh, M², M²) layout.

Differences: the converted model has `pad_attends=True` (HF attends to the
zero padding of grids that are not a multiple of M; see `hf_vision`); HF
blocks shifted-window pairs with -100.0 added to the score, attnkit with an
exact 0 weight. HF runs any image size (padding the image to a multiple of P
and re-deciding windows per call); attnkit's model is built for
`config.image_size`. A stage grid smaller than M makes HF's bias mismatch its
windows, so such configs are refused. Dropout / drop path are not converted
(inference only: HF's drop path has no weights).
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from attnkit.convert._state import Shape
from attnkit.convert.hf_vision import SWIN_LAYER_TABLE, _dump_table, _load_table

__all__ = [
    "SWIN_MODEL_TABLE",
    "hf_swin_model_state",
    "load_hf_swin_model_state",
    "swin_config_from_hf",
    "swin_from_hf",
]

# attnkit SwinModel name -> HF SwinModel name (blocks follow SWIN_LAYER_TABLE)
SWIN_MODEL_TABLE: dict[str, str] = {
    "embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
    "embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
    "embed_norm.weight": "embeddings.norm.weight",
    "embed_norm.bias": "embeddings.norm.bias",
    "pos": "embeddings.position_embeddings",
    "norm.weight": "layernorm.weight",
    "norm.bias": "layernorm.bias",
    "stages.{s}.downsample.norm.weight": "encoder.layers.{s}.downsample.norm.weight",
    "stages.{s}.downsample.norm.bias": "encoder.layers.{s}.downsample.norm.bias",
    "stages.{s}.downsample.reduction.weight": "encoder.layers.{s}.downsample.reduction.weight",
}


def _swin_model_table(swin: nn.Module) -> tuple[dict[str, tuple[str, ...]], dict[str, Shape]]:
    """attnkit name -> (HF name,), and HF's shape where it differs (the patch conv)."""
    table: dict[str, tuple[str, ...]] = {}
    for s, stage in enumerate(swin.stages):
        for ours, theirs in SWIN_MODEL_TABLE.items():
            if "{s}" in ours and stage.downsample is not None:
                table[ours.format(s=s)] = (theirs.format(s=s),)
        for i in range(len(stage.blocks)):
            for ours, theirs in SWIN_LAYER_TABLE.items():
                table[f"stages.{s}.blocks.{i}.{ours}"] = tuple(
                    f"encoder.layers.{s}.blocks.{i}.{t}" for t in theirs
                )
    table |= {k: (v,) for k, v in SWIN_MODEL_TABLE.items() if "{s}" not in k}
    cfg = swin.config
    p = cfg.patch_size
    shapes = {table["embed.proj.weight"][0]: (cfg.embed_dim, cfg.in_chans, p, p)}
    return table, shapes


def load_hf_swin_model_state(swin: nn.Module, state: Mapping[str, Tensor]) -> nn.Module:
    """Copy an HF `SwinModel` state dict into an attnkit `SwinModel`, exactly.

    Raises ValueError naming every missing, unexpected or mis-shaped key.
    """
    table, shapes = _swin_model_table(swin)
    return _load_table(swin, state, table, "load_hf_swin_model_state", shapes)


def hf_swin_model_state(swin: nn.Module) -> dict[str, Tensor]:
    """`swin`'s weights under HF `SwinModel` names (`model.load_state_dict(..., strict=True)`)."""
    return _dump_table(swin, *_swin_model_table(swin))


def _one(name: str, v, problems: list[str]) -> int:
    if isinstance(v, int):
        return v
    if isinstance(v, (tuple, list)) and len(v) == 2 and v[0] == v[1]:
        return int(v[0])
    problems.append(f"{name}={v!r} is not square (attnkit's SwinModel is)")
    return 0


def swin_config_from_hf(config, *, pool: bool):
    """The `attnkit.vision.SwinConfig` of an HF `SwinConfig`, with `pad_attends=True`.

    Refuses (ValueError listing every problem) what attnkit's SwinModel cannot hold.
    """
    from attnkit.vision.swin import SwinConfig

    problems: list[str] = []
    image = _one("image_size", config.image_size, problems)
    patch = _one("patch_size", config.patch_size, problems)
    if patch and image % patch:
        problems.append(f"image_size={image} is not a multiple of patch_size={patch}")
    if config.hidden_act not in ("gelu", "relu", "silu"):
        problems.append(f"hidden_act={config.hidden_act!r} has no attnkit activation name")
    if problems:
        raise ValueError("swin_from_hf: attnkit's SwinModel cannot express " + "; ".join(problems))
    cfg = SwinConfig(
        image_size=image,
        patch_size=patch,
        in_chans=config.num_channels,
        embed_dim=config.embed_dim,
        depths=tuple(config.depths),
        num_heads=tuple(config.num_heads),
        window_size=config.window_size,
        mlp_ratio=config.mlp_ratio,
        qkv_bias=config.qkv_bias,
        activation=config.hidden_act,
        dropout=config.hidden_dropout_prob,
        attn_dropout=config.attention_probs_dropout_prob,
        norm_eps=config.layer_norm_eps,
        absolute_pos=config.use_absolute_embeddings,
        pool=pool,
        pad_attends=True,
    )
    small = [g for g in cfg.grids if min(g) < cfg.window_size]
    if small:
        raise ValueError(
            f"swin_from_hf: stage grid {small[0]} is smaller than window_size="
            f"{cfg.window_size}; HF's bias table does not fit its windows there"
        )
    return cfg


def swin_from_hf(model: nn.Module) -> nn.Module:
    """An `attnkit.vision.SwinModel` equal to an HF `SwinModel` (eager attention numbers).

    `SwinModel(x)` is HF's `pooler_output` (without a pooler: the tokens,
    `last_hidden_state`); `features(x)` its `last_hidden_state`.
    """
    from attnkit.vision.swin import SwinModel

    if not hasattr(model, "embeddings") or not hasattr(model, "encoder"):
        raise ValueError(
            f"swin_from_hf: expected a transformers SwinModel, got {type(model).__name__} "
            "(for SwinForImageClassification convert model.swin)"
        )
    cfg = swin_config_from_hf(model.config, pool=model.pooler is not None)
    ref = next(model.parameters())
    swin = SwinModel(cfg).to(device=ref.device, dtype=ref.dtype)
    return load_hf_swin_model_state(swin, {k: v.detach() for k, v in model.state_dict().items()})
