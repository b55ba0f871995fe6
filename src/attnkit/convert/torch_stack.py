"""`torch.nn.TransformerEncoder` / `TransformerDecoder` <-> `EncoderStack` / `DecoderStack`.

| torch.nn.TransformerEncoder / Decoder   | attnkit.convert.EncoderStack / DecoderStack     |
| --------------------------------------- | ----------------------------------------------- |
| layers.{i}.* (TransformerEncoderLayer)  | layers.{i}.* (EncoderBlock: `torch_transformer`) |
| layers.{i}.* (TransformerDecoderLayer)  | layers.{i}.* (DecoderBlock: `torch_decoder`)     |
| norm.* (the optional final norm)        | norm.* (`nn.Identity` when there is none)        |

Dimensions: B batch, N source length, T target length, S memory length, C model width,
H heads.

torch's stacks are `num_layers` deep copies of one layer whose weights then train apart;
each converts with `encoder_from_torch` / `decoder_from_torch`, so every setting those
take (norm_first, activation, eps, bias, dropouts) converts here too, and the final norm
is copied as it is. `enable_nested_tensor` and `mask_check` have no weights and no
meaning in attnkit. The stacks are batch first, (B, N, C): a sequence-first torch stack
is refused unless `batch_first=True` acknowledges the change (see `torch_nn`).

Masks: torch hands every layer the same masks, and so do these stacks. Encoder:
`encoder_mask_from_torch(mask, src_key_padding_mask)`, or `causal=True` for torch's
`is_causal` with `generate_square_subsequent_mask`. Decoder: `decoder_masks_from_torch`
(`DecoderBlock` is always causal, as there).

torch's encoder in eval without autograd, given `src_key_padding_mask` and no `mask`,
may take its nested-tensor path (post-norm, batch-first layers, even head count,
`enable_nested_tensor=True`): it returns 0 at the padded positions. attnkit computes
those positions like any other (they attend to the real keys), as torch's own layers
do on their regular path; the real positions agree. `encoder_stack_to_torch` builds the
torch encoder with `enable_nested_tensor=False` unless asked otherwise.
"""

from __future__ import annotations

import copy

from torch import Tensor, nn

from attnkit.convert._state import load_by_table
from attnkit.convert.torch_decoder import DECODER_TABLE, decoder_from_torch, decoder_to_torch
from attnkit.convert.torch_nn import check_batch_first
from attnkit.convert.torch_transformer import ENCODER_TABLE, encoder_from_torch, encoder_to_torch
from attnkit.models.decoding import KVCache
from attnkit.models.transformer import DecoderBlock
from attnkit.modules.blocks import EncoderBlock

__all__ = [
    "DecoderStack",
    "EncoderStack",
    "decoder_stack_from_torch",
    "decoder_stack_to_torch",
    "encoder_stack_from_torch",
    "encoder_stack_to_torch",
    "load_torch_decoder_stack_state",
    "load_torch_encoder_stack_state",
]


class EncoderStack(nn.Module):
    """Blocks in turn, then an optional final norm: `torch.nn.TransformerEncoder`, batch first.

    Args:
        layers: the blocks (`EncoderBlock`s for `to_torch`), each called as
            `layer(x, mask=..., causal=...)`.
        norm: applied to the last block's output (None: `nn.Identity`).
    """

    def __init__(self, layers: list[nn.Module], norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.Identity() if norm is None else norm

    def forward(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """x (B, N, C) -> (B, N, C).

        mask: boolean, True = may attend, broadcastable to (B, H, N, N) (a key-padding
            mask is (B, 1, 1, N)); every block gets it, as in torch.
        causal: query i sees keys j <= i (torch: `mask=generate_square_subsequent_mask(N)`).
        A query that may attend to no key gets attention output 0, never NaN.
        """
        for layer in self.layers:
            x = layer(x, mask=mask, causal=causal)
        return self.norm(x)


class DecoderStack(nn.Module):
    """Decoder blocks in turn, then an optional final norm: `torch.nn.TransformerDecoder`,
    batch first, causal (as `DecoderBlock` is).

    Args:
        layers: `DecoderBlock`s (with cross-attention).
        norm: applied to the last block's output (None: `nn.Identity`).
    """

    def __init__(self, layers: list[nn.Module], norm: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = nn.Identity() if norm is None else norm

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """x (B, T, C), memory (B, S, C) -> (B, T, C).

        mask: target mask, True = may attend, broadcastable to (B, H, T, T), on top of the
            causal one (bottom-right aligned with a cache).
        memory_mask: True = may attend, broadcastable to (B, H, T, S).
        cache: keys and values of earlier steps; x then holds only the new positions, and
            `cache.length` advances by them (as `attnkit.models.Transformer.decode` does).
        """
        for layer in self.layers:
            x = layer(x, memory, mask=mask, memory_mask=memory_mask, cache=cache)
        if cache is not None:
            cache.length += x.shape[1]
        return self.norm(x)


def _layers_batch_first(what: str, stack: nn.Module, batch_first: bool | None) -> bool:
    """The one layout of `stack`'s layers, checked against the caller's `batch_first`."""
    if not len(stack.layers):
        raise ValueError(f"from_torch: this {what} has no layers")
    layouts = {bool(layer.self_attn.batch_first) for layer in stack.layers}
    if len(layouts) != 1:
        raise ValueError(f"from_torch: the layers of this {what} differ in batch_first")
    torch_batch_first = layouts.pop()
    check_batch_first(what, torch_batch_first, batch_first)
    return torch_batch_first


def _norm_from_torch(norm: nn.Module | None) -> nn.Module | None:
    return None if norm is None else copy.deepcopy(norm)


def _norm_to_torch(norm: nn.Module) -> nn.Module | None:
    return None if isinstance(norm, nn.Identity) else copy.deepcopy(norm)


def encoder_stack_from_torch(
    encoder: nn.TransformerEncoder, *, batch_first: bool | None = None
) -> EncoderStack:
    """An `EncoderStack` with exactly the layers, weights and final norm of `encoder`.

    A sequence-first `encoder` is refused (ValueError naming `batch_first`) unless
    `batch_first=True` says you will give the stack (B, N, C) inputs.
    """
    if not isinstance(encoder, nn.TransformerEncoder):
        raise ValueError(f"expected torch.nn.TransformerEncoder, got {type(encoder).__name__}")
    torch_bf = _layers_batch_first("nn.TransformerEncoder", encoder, batch_first)
    layers = [encoder_from_torch(layer, batch_first=True) for layer in encoder.layers]
    stack = EncoderStack(layers, _norm_from_torch(encoder.norm))
    stack._torch_batch_first = torch_bf  # read by encoder_stack_to_torch only
    return stack


def decoder_stack_from_torch(
    decoder: nn.TransformerDecoder, *, batch_first: bool | None = None
) -> DecoderStack:
    """A `DecoderStack` with exactly the layers, weights and final norm of `decoder`.

    A sequence-first `decoder` is refused (ValueError naming `batch_first`) unless
    `batch_first=True` says you will give the stack (B, T, C) and (B, S, C) inputs.
    """
    if not isinstance(decoder, nn.TransformerDecoder):
        raise ValueError(f"expected torch.nn.TransformerDecoder, got {type(decoder).__name__}")
    torch_bf = _layers_batch_first("nn.TransformerDecoder", decoder, batch_first)
    layers = [decoder_from_torch(layer, batch_first=True) for layer in decoder.layers]
    stack = DecoderStack(layers, _norm_from_torch(decoder.norm))
    stack._torch_batch_first = torch_bf  # read by decoder_stack_to_torch only
    return stack


def _blocks(stack: nn.Module, cls: type, peer: str) -> list[nn.Module]:
    wrong = [type(b).__name__ for b in stack.layers if not isinstance(b, cls)]
    if wrong or not stack.layers:
        got = ", ".join(wrong) if wrong else "no layers"
        raise ValueError(f"to_torch: {peer} needs one or more {cls.__name__}s, got {got}")
    return list(stack.layers)


def encoder_stack_to_torch(
    stack: EncoderStack, *, batch_first: bool | None = None, enable_nested_tensor: bool = False
) -> nn.TransformerEncoder:
    """A `torch.nn.TransformerEncoder` with exactly the layers, weights and norm of `stack`.

    `batch_first` defaults to the layout of the encoder `stack` came from (True for a
    stack built in attnkit). `enable_nested_tensor` is off by default: torch's nested
    path returns 0 at padded positions, where attnkit (and torch's regular path) computes
    them.
    """
    if batch_first is None:
        batch_first = getattr(stack, "_torch_batch_first", True)
    blocks = _blocks(stack, EncoderBlock, "TransformerEncoder")
    layers = [encoder_to_torch(b, batch_first=batch_first) for b in blocks]
    out = nn.TransformerEncoder(
        layers[0], len(layers), norm=_norm_to_torch(stack.norm),
        enable_nested_tensor=enable_nested_tensor,
    )  # fmt: skip
    out.layers = nn.ModuleList(layers)  # torch copied layers[0]; each keeps its own weights
    return out


def decoder_stack_to_torch(
    stack: DecoderStack, *, batch_first: bool | None = None
) -> nn.TransformerDecoder:
    """A `torch.nn.TransformerDecoder` with exactly the layers, weights and norm of `stack`.

    `batch_first` defaults to the layout of the decoder `stack` came from (True for a
    stack built in attnkit). torch applies no causal mask by itself: call it with
    `tgt_mask=nn.Transformer.generate_square_subsequent_mask(T)`.
    """
    if batch_first is None:
        batch_first = getattr(stack, "_torch_batch_first", True)
    blocks = _blocks(stack, DecoderBlock, "TransformerDecoder")
    layers = [decoder_to_torch(b, batch_first=batch_first) for b in blocks]
    out = nn.TransformerDecoder(layers[0], len(layers), norm=_norm_to_torch(stack.norm))
    out.layers = nn.ModuleList(layers)
    return out


def _stack_table(stack: nn.Module, layer_table: dict[str, str]) -> dict[str, str]:
    """torch name -> attnkit name for every parameter of `stack` (layers.{i}.*, norm.*)."""
    table = {
        f"layers.{i}.{theirs}": f"layers.{i}.{ours}"
        for i in range(len(stack.layers))
        for theirs, ours in layer_table.items()
    }
    table.update({f"norm.{k}": f"norm.{k}" for k in stack.norm.state_dict()})
    return table


def load_torch_encoder_stack_state(stack: EncoderStack, state: dict[str, Tensor]) -> EncoderStack:
    """Copy a `TransformerEncoder` state dict into `stack`, exactly; returns `stack`.

    Raises ValueError naming every missing, unexpected or mis-shaped key.
    """
    table = _stack_table(stack, ENCODER_TABLE)
    return load_by_table(stack, state, table, source="load_torch_encoder_stack_state")


def load_torch_decoder_stack_state(stack: DecoderStack, state: dict[str, Tensor]) -> DecoderStack:
    """Copy a `TransformerDecoder` state dict into `stack`, exactly; returns `stack`.

    Raises ValueError naming every missing, unexpected or mis-shaped key.
    """
    table = _stack_table(stack, DECODER_TABLE)
    return load_by_table(stack, state, table, source="load_torch_decoder_stack_state")
