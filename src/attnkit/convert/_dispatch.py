"""One entry point per direction: `from_torch`, `to_torch`, `from_keras`, `to_keras`.

Each looks at the type of what it is given and calls the converter written for
it (the `mha_*`, `encoder_*`, `decoder_*`, `additive_*`, `luong_*` functions of
`attnkit.convert`). They live here, not as methods of the modules, so that
imports go one way: a converter knows the module it converts; the module never
imports its converter (DESIGN.md, "Layers").
"""

from __future__ import annotations

from typing import Any

from torch import nn

from attnkit.convert.keras import (
    _keras,
    additive_from_keras,
    additive_to_keras,
    luong_from_keras,
    luong_to_keras,
    mha_from_keras,
    mha_to_keras,
)
from attnkit.convert.torch_decoder import decoder_from_torch, decoder_to_torch
from attnkit.convert.torch_nn import mha_from_torch, mha_to_torch
from attnkit.convert.torch_stack import (
    DecoderStack,
    EncoderStack,
    decoder_stack_from_torch,
    decoder_stack_to_torch,
    encoder_stack_from_torch,
    encoder_stack_to_torch,
)
from attnkit.convert.torch_transformer import encoder_from_torch, encoder_to_torch
from attnkit.models.transformer import DecoderBlock
from attnkit.modules.additive import AdditiveAttention, LuongAttention
from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.blocks import EncoderBlock

__all__ = ["from_keras", "from_torch", "to_keras", "to_torch"]

_FROM_TORCH = (
    (nn.MultiheadAttention, mha_from_torch),
    (nn.TransformerEncoderLayer, encoder_from_torch),
    (nn.TransformerDecoderLayer, decoder_from_torch),
    (nn.TransformerEncoder, encoder_stack_from_torch),
    (nn.TransformerDecoder, decoder_stack_from_torch),
)
_TO_TORCH = (
    (MultiHeadAttention, mha_to_torch),
    (EncoderBlock, encoder_to_torch),
    (DecoderBlock, decoder_to_torch),
    (EncoderStack, encoder_stack_to_torch),
    (DecoderStack, decoder_stack_to_torch),
)
_TO_KERAS = (
    (MultiHeadAttention, mha_to_keras),
    (AdditiveAttention, additive_to_keras),
    (LuongAttention, luong_to_keras),
)


def _pick(table, obj, source: str):
    for cls, fn in table:
        if isinstance(obj, cls):
            return fn
    names = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls, _ in table)
    raise ValueError(f"{source}: expected one of {names}, got {type(obj).__name__}")


def from_torch(layer: nn.Module, *, batch_first: bool | None = None) -> nn.Module:
    """Exact attnkit copy of a torch layer: `nn.MultiheadAttention` -> `MultiHeadAttention`,
    `nn.TransformerEncoderLayer` -> `EncoderBlock`, `nn.TransformerDecoderLayer` ->
    `DecoderBlock` (`attnkit.models.transformer`), `nn.TransformerEncoder` / `Decoder` ->
    `EncoderStack` / `DecoderStack` (`attnkit.convert.torch_stack`).

    attnkit modules read (B, N, C). A sequence-first `layer` (`batch_first=False`, torch's
    default) is refused with a ValueError naming `batch_first` and what to do, unless
    `batch_first=True` acknowledges that the copy reads (B, N, C)."""
    return _pick(_FROM_TORCH, layer, "from_torch")(layer, batch_first=batch_first)


def to_torch(module: nn.Module, **kwargs) -> nn.Module:
    """Exact torch copy of an attnkit module (the inverse of `from_torch`); `kwargs` (e.g.
    `batch_first`) go to `mha_to_torch`, `encoder_to_torch`, `decoder_to_torch`,
    `encoder_stack_to_torch` or `decoder_stack_to_torch`."""
    return _pick(_TO_TORCH, module, "to_torch")(module, **kwargs)


def from_keras(layer: Any) -> nn.Module:
    """Exact attnkit copy of a built Keras layer: `MultiHeadAttention` -> `MultiHeadAttention`,
    `AdditiveAttention` or `Attention(score_mode="concat")` -> `AdditiveAttention`,
    `Attention(score_mode="dot")` -> `LuongAttention`. Keras is imported here, on call."""
    layers = _keras().layers
    if isinstance(layer, layers.MultiHeadAttention):
        return mha_from_keras(layer)
    if isinstance(layer, layers.AdditiveAttention):
        return additive_from_keras(layer)
    if isinstance(layer, layers.Attention):
        concat = layer.score_mode == "concat"
        return additive_from_keras(layer) if concat else luong_from_keras(layer)
    raise ValueError(
        "from_keras: expected keras.layers.MultiHeadAttention, AdditiveAttention or "
        f"Attention, got {type(layer).__name__}"
    )


def to_keras(module: nn.Module, **kwargs) -> Any:
    """Exact Keras copy of an attnkit module (the inverse of `from_keras`); `kwargs` go to
    `mha_to_keras`, `additive_to_keras` or `luong_to_keras`."""
    return _pick(_TO_KERAS, module, "to_keras")(module, **kwargs)
