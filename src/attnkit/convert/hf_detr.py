"""Hugging Face DETR (`DetrModel`, `DetrForObjectDetection`; transformers 5.x names) ->
`attnkit.models.detr.DetrTransformer`: the transformer only, not the CNN backbone.

| HF DetrModel (per layer, relative)          | attnkit DetrTransformer                   |
| ------------------------------------------- | ----------------------------------------- |
| encoder.layers.{i}.                         | encoder.layers.{i}. (EncoderBlock)        |
|   self_attn.{q,k,v}_proj.weight (C, C)      |   attn.fn.in_proj.qkv.weight (3C, C)      |
|   self_attn.{q,k,v}_proj.bias (C,)          |   attn.fn.in_proj.qkv.bias (3C,)          |
|   self_attn.o_proj.*                        |   attn.fn.proj.*                          |
|   self_attn_layer_norm.*                    |   attn.norm.*                             |
|   mlp.fc1.*, mlp.fc2.*                      |   ff.fn.fc1.*, ff.fn.fc2.*                |
|   final_layer_norm.*                        |   ff.norm.*                               |
| decoder.layers.{i}.                         | decoder.layers.{i}. (DecoderBlock)        |
|   self_attn.* , self_attn_layer_norm.*      |   self_attn.fn.*, self_attn.norm.* (as    |
|                                             |   above: q, k, v rows concatenated)       |
|   encoder_attn.{q,k,v}_proj.*, o_proj.*     |   cross_attn.fn.in_proj.qkv.*, .proj.*    |
|   encoder_attn_layer_norm.*                 |   cross_attn.norm.*                       |
|   mlp.fc1.*, mlp.fc2.*, final_layer_norm.*  |   ff.fn.fc1.*, ff.fn.fc2.*, ff.norm.*     |
| decoder.layernorm.*                         | decoder.norm.*                            |
| query_position_embeddings.weight (Q, C)     | query_embed.weight (Q, C)                 |

Inputs: HF's encoder gets the projected feature map flattened to (B, h·w, C)
(`input_projection`, then `flatten(2).transpose(1, 2)`), its pixel mask
downsampled to (B, h·w) (1 = real: pass it as bool to `src_key_mask`) and
`DetrSinePositionEmbedding(C // 2, normalize=True)` of that mask, which
`attnkit.positional.detr_sine_2d(mask, C)` reproduces. HF's `last_hidden_state`
is `out[-1]`, its `encoder_last_hidden_state` the returned memory.

Differences: HF's `auxiliary_loss=True` feeds each layer's *normalised* output to
the next layer (and normalises the last one twice); DETR's code, and attnkit's
`return_intermediate=True`, normalise only the copies they return. Dropout rates
are not converted (inference: `dropout` is set from `config.dropout`, and HF's
separate `attention_dropout` / `activation_dropout` are not kept).
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from attnkit.convert.hf_vision import _dump_table, _load_table
from attnkit.models.detr import DetrTransformer

__all__ = [
    "DETR_DECODER_LAYER_TABLE",
    "DETR_ENCODER_LAYER_TABLE",
    "detr_transformer_from_hf",
    "hf_detr_state",
    "load_hf_detr_state",
]


def _attention(ours: str, theirs: str) -> dict[str, tuple[str, ...]]:
    return {
        f"{ours}.fn.in_proj.qkv.weight": tuple(f"{theirs}.{p}_proj.weight" for p in "qkv"),
        f"{ours}.fn.in_proj.qkv.bias": tuple(f"{theirs}.{p}_proj.bias" for p in "qkv"),
        f"{ours}.fn.proj.weight": (f"{theirs}.o_proj.weight",),
        f"{ours}.fn.proj.bias": (f"{theirs}.o_proj.bias",),
        f"{ours}.norm.weight": (f"{theirs}_layer_norm.weight",),
        f"{ours}.norm.bias": (f"{theirs}_layer_norm.bias",),
    }


_FF: dict[str, tuple[str, ...]] = {
    "ff.fn.fc1.weight": ("mlp.fc1.weight",),
    "ff.fn.fc1.bias": ("mlp.fc1.bias",),
    "ff.fn.fc2.weight": ("mlp.fc2.weight",),
    "ff.fn.fc2.bias": ("mlp.fc2.bias",),
    "ff.norm.weight": ("final_layer_norm.weight",),
    "ff.norm.bias": ("final_layer_norm.bias",),
}
# attnkit name -> the HF name(s) it is made of (several are concatenated on dim 0)
DETR_ENCODER_LAYER_TABLE: dict[str, tuple[str, ...]] = _attention("attn", "self_attn") | _FF
DETR_DECODER_LAYER_TABLE: dict[str, tuple[str, ...]] = (
    _attention("self_attn", "self_attn") | _attention("cross_attn", "encoder_attn") | _FF
)
_TOP: dict[str, tuple[str, ...]] = {
    "decoder.norm.weight": ("decoder.layernorm.weight",),
    "decoder.norm.bias": ("decoder.layernorm.bias",),
    "query_embed.weight": ("query_position_embeddings.weight",),
}
_PREFIXES = ("encoder.", "decoder.", "query_position_embeddings.")


def _table(ours: DetrTransformer) -> dict[str, tuple[str, ...]]:
    if not isinstance(ours, DetrTransformer):
        raise ValueError(f"expected an attnkit DetrTransformer, got {type(ours).__name__}")
    if not isinstance(ours.encoder.norm, nn.Identity):
        raise ValueError("Hugging Face DETR is post-norm: a norm_first=True model has no HF names")
    table = dict(_TOP)
    for stack, layer_table in (
        ("encoder", DETR_ENCODER_LAYER_TABLE),
        ("decoder", DETR_DECODER_LAYER_TABLE),
    ):
        for i in range(len(getattr(ours, stack).layers)):
            p = f"{stack}.layers.{i}."
            table |= {p + k: tuple(p + t for t in v) for k, v in layer_table.items()}
    return table


def load_hf_detr_state(ours: DetrTransformer, state: Mapping[str, Tensor]) -> DetrTransformer:
    """Copy the transformer part of an HF `DetrModel` state dict (keys under `encoder.`,
    `decoder.`, `query_position_embeddings.`) into `ours`, exactly; ValueError naming
    every missing, unexpected or mis-shaped key."""
    return _load_table(ours, state, _table(ours), "load_hf_detr_state")


def hf_detr_state(ours: DetrTransformer) -> dict[str, Tensor]:
    """`ours`' weights under HF `DetrModel` names (load with `strict=False`: no backbone)."""
    return _dump_table(ours, _table(ours))


def _detr_model(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", model)  # DetrForObjectDetection wraps a DetrModel
    if not all(hasattr(inner, a) for a in ("encoder", "decoder", "query_position_embeddings")):
        raise ValueError(
            f"expected a transformers DetrModel or DetrForObjectDetection, got "
            f"{type(model).__name__}"
        )
    return inner


def detr_transformer_from_hf(
    model: nn.Module, *, return_intermediate: bool = False
) -> DetrTransformer:
    """A `DetrTransformer` with the weights of an HF DETR model's transformer, exactly."""
    inner = _detr_model(model)
    c = inner.config
    problems = []
    if c.encoder_attention_heads != c.decoder_attention_heads:
        problems.append(
            f"encoder_attention_heads={c.encoder_attention_heads} != "
            f"decoder_attention_heads={c.decoder_attention_heads}"
        )
    if c.encoder_ffn_dim != c.decoder_ffn_dim:
        problems.append(
            f"encoder_ffn_dim={c.encoder_ffn_dim} != decoder_ffn_dim={c.decoder_ffn_dim}"
        )
    if c.activation_function != "relu":
        problems.append(f"activation_function={c.activation_function!r} (DETR's is 'relu')")
    if problems:
        raise ValueError("detr_transformer_from_hf: cannot express " + "; ".join(problems))
    w = inner.query_position_embeddings.weight
    ours = DetrTransformer(
        c.d_model,
        c.encoder_attention_heads,
        c.encoder_layers,
        c.decoder_layers,
        c.encoder_ffn_dim,
        c.dropout,
        c.num_queries,
        return_intermediate=return_intermediate,
        device=w.device,
        dtype=w.dtype,
    )
    state = {k: v.detach() for k, v in inner.state_dict().items() if k.startswith(_PREFIXES)}
    return load_hf_detr_state(ours, state)
