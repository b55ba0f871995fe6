"""attnkit as an attention backend of Hugging Face transformers.

Importing this module registers the name ``"attnkit"`` with transformers'
``AttentionInterface`` (the attention call) and ``AttentionMaskInterface`` (the
mask the model builds for it), so that

    AutoModel.from_pretrained(path, attn_implementation="attnkit")

runs every attention call of the model through `attnkit.attention`, and
`attnkit.record_attention(model)` captures the per-head maps of such a model under
its own module paths (``"encoder.layer.0.attention.self"``).

What the model hands over and what attnkit gets:

* q (B, H, N, D), k and v (B, Hkv, S, D): passed as they are; Hkv < H (GQA/MQA) is
  handled by attnkit without repeating k and v.
* Masks: transformers' boolean masks (True = may attend, the attnkit polarity). For a
  causal layer whose queries end at the last key (no cache, or a dynamic cache), the
  mask is only the padding, (B, 1, 1, S), and attnkit applies ``causal=True``
  (bottom-right aligned), so no N x S mask is built. Every other pattern (sliding
  windows, packed sequences, static caches) arrives as the full (B, 1, N, S) mask.
  Float masks (Swin's shift mask plus relative bias, user masks) are additive: `bias`.
* Query rows that may attend to nothing (left padding in a decoder) give output 0
  here, where eager spreads them uniformly over the masked keys: they are padding,
  and no real token reads them.
* Unsupported and refused with a ValueError naming them: ``softcap`` (Gemma 2 style
  logit soft-capping), ``s_aux`` (attention sinks) and paged caches.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import (
    AttentionMaskInterface,
    causal_mask_function,
    prepare_padding_mask,
    sdpa_mask,
)

from attnkit.functional.attention import attention
from attnkit.viz import record as _record

__all__ = ["NAME", "attnkit_attention_forward", "attnkit_mask"]

NAME = "attnkit"


def attnkit_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function=causal_mask_function,
    attention_mask: Tensor | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    **kwargs: Any,
) -> Tensor | None:
    """The mask transformers builds for an attnkit layer: boolean, True = may attend.

    Returns None (no mask), the padding alone as (B, 1, 1, S) for a plain causal
    pattern whose last query is the last key (the attention function then passes
    ``causal=True``), or the full (B, 1, N, S) mask of any other pattern.
    """
    aligned = (
        isinstance(q_offset, int)
        and isinstance(kv_offset, int)
        and q_offset + q_length == kv_offset + kv_length
    )
    if mask_function is causal_mask_function and aligned and not torch.compiler.is_compiling():
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is None:
            return None
        padding = padding[:, kv_offset : kv_offset + kv_length].bool()  # (B, S)
        if bool(padding.all()):
            return None
        return padding[:, None, None, :]  # (B, 1, 1, S)
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,  # the full pattern: its alignment may not be bottom-right
        allow_is_bidirectional_skip=allow_is_bidirectional_skip,
        **{k: v for k, v in kwargs.items() if k in ("use_vmap", "device", "local_size")},
    )


_UNSUPPORTED = {
    "softcap": "logit soft-capping (Gemma 2 style)",
    "s_aux": "attention sinks",
}


def attnkit_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    position_bias: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """transformers' attention call, computed by `attnkit.attention`.

    query (B, H, N, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv); attention_mask
    boolean (True = may attend) or float (additive), broadcastable to (B, H, N, S).
    Returns (output (B, N, H, Dv), weights (B, H, N, S) or None): the weights only
    when the model asks for ``output_attentions``.
    """
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise ValueError(
                f"attn_implementation='attnkit': {name}={kwargs[name]!r} ({what}) is not "
                f"supported by attnkit; load {type(module).__name__}'s model with "
                "attn_implementation='eager'"
            )
    if kwargs.get("cache") is not None:
        raise ValueError(
            "attn_implementation='attnkit': paged caches (cache=...) are not supported"
        )
    n = query.shape[2]
    causal_layer = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    mask = bias = None
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        mask = attention_mask
    elif attention_mask is not None:
        bias = attention_mask
    # Only a padding-only mask (or none) leaves the causal pattern to attnkit: a full mask
    # already holds it, with transformers' own alignment.
    causal = (
        bool(causal_layer)
        and n > 1
        and (attention_mask is None or (mask is not None and mask.shape[-2] == 1))
    )
    if position_bias is not None:  # T5-style learned bias, (B or 1, H, N, S)
        bias = position_bias if bias is None else bias + position_bias
    sink = _record.recording_sink(module)
    need_weights = sink is not None or bool(kwargs.get("output_attentions", False))
    out, weights, _ = attention(
        query, key, value, mask=mask, bias=bias, causal=causal, scale=scaling,
        dropout_p=dropout, training=module.training, need_weights=need_weights,
    )  # fmt: skip
    if sink is not None:
        sink(weights)
    out = out.transpose(1, 2).contiguous()  # (B, H, N, Dv) -> (B, N, H, Dv)
    return out, weights if kwargs.get("output_attentions", False) else None


def _claims(model: nn.Module) -> bool:
    """True if some part of `model` runs its attention through this backend."""
    for sub in model.modules():
        config = getattr(sub, "config", None)
        if getattr(config, "_attn_implementation", None) == NAME:
            return True
    return False


AttentionInterface.register(NAME, attnkit_attention_forward)
AttentionMaskInterface.register(NAME, attnkit_mask)
_record.register_external(_claims)
