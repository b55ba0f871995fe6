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

import os
from dataclasses import dataclass
from pathlib import Path
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

__all__ = [
    "NAME",
    "TextAttention",
    "attnkit_attention_forward",
    "attnkit_mask",
    "load_checkpoint",
    "text_attention",
]

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


# --- A local checkpoint folder of any supported family, for `attnkit explain --checkpoint` ---


@dataclass(frozen=True)
class TextAttention:
    """What a checkpoint's attention does on one text (one example, no batch).

    tokens:  the N token strings the tokenizer produced (special tokens included).
    names:   module path of each attention layer, in the order the layers ran.
    maps:    per layer, (H, N, N) probabilities; causal (zero above the diagonal) for decoders.
    unknown: the pieces of the text the tokenizer could only map to its unknown token.
    decoder: True when the model is a causal language model.
    """

    tokens: list[str]
    names: list[str]
    maps: list[Tensor]
    unknown: list[str]
    decoder: bool


def load_checkpoint(folder: str | os.PathLike[str]) -> tuple[nn.Module, Any]:
    """(model in eval mode on the attnkit backend, tokenizer) from a local checkpoint folder.

    A causal language model (``architectures`` ending in ``ForCausalLM`` or ``LMHeadModel``)
    is loaded with its head, anything else as its base model. Never downloads (local files
    only). Raises ValueError naming the folder when it holds no loadable model or tokenizer.
    """
    import transformers

    path = Path(folder)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"checkpoint: {str(path)!r} holds no config.json (not a transformers folder)"
        )
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
        archs = getattr(config, "architectures", None) or []
        decoder = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
        auto = transformers.AutoModelForCausalLM if decoder else transformers.AutoModel
        model = auto.from_pretrained(path, attn_implementation=NAME, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"checkpoint: cannot load {str(path)!r}: {err}") from err
    return model.eval(), tokenizer


def text_attention(model: nn.Module, tokenizer: Any, text: str) -> TextAttention:
    """Run `text` through `model` while recording; see `TextAttention`."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text: expected a non-empty string, got {text!r}")
    enc = tokenizer(text, return_tensors="pt", return_offsets_mapping=tokenizer.is_fast)
    ids = enc["input_ids"]  # (1, N)
    unknown = []
    if tokenizer.unk_token_id is not None and "offset_mapping" in enc:
        for (start, end), tok in zip(
            enc["offset_mapping"][0].tolist(), ids[0].tolist(), strict=True
        ):
            if tok == tokenizer.unk_token_id:
                unknown.append(text[start:end])
    with torch.no_grad(), _record.record_attention(model) as rec:
        model(input_ids=ids, attention_mask=enc.get("attention_mask"))
    return TextAttention(
        tokens=tokenizer.convert_ids_to_tokens(ids[0].tolist()),
        names=rec.names,
        maps=[m[0] for m in rec.layers()],  # (B, H, N, N) -> (H, N, N)
        unknown=unknown,
        decoder=bool(getattr(model.config, "is_decoder", False))
        or type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")),
    )


AttentionInterface.register(NAME, attnkit_attention_forward)
AttentionMaskInterface.register(NAME, attnkit_mask)
_record.register_external(_claims)
