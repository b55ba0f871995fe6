"""`torch.nn.TransformerEncoderLayer` <-> `attnkit.EncoderBlock` (decoder: `torch_decoder`).

| torch.nn.TransformerEncoderLayer    | attnkit.EncoderBlock                 |
| ----------------------------------- | ------------------------------------ |
| self_attn.in_proj_weight (3C, C)    | attn.fn.in_proj.qkv.weight (3C, C)   |
| self_attn.in_proj_bias (3C,)        | attn.fn.in_proj.qkv.bias (3C,)       |
| self_attn.out_proj.weight (C, C)    | attn.fn.proj.weight (C, C)           |
| self_attn.out_proj.bias (C,)        | attn.fn.proj.bias (C,)               |
| norm1.weight, norm1.bias (C,)       | attn.norm.weight, attn.norm.bias     |
| linear1.weight (F, C), .bias (F,)   | ff.fn.fc1.weight, ff.fn.fc1.bias     |
| linear2.weight (C, F), .bias (C,)   | ff.fn.fc2.weight, ff.fn.fc2.bias     |
| norm2.weight, norm2.bias (C,)       | ff.norm.weight, ff.norm.bias         |

The same names serve pre-norm (`norm_first=True`: x + sublayer(norm(x))) and
post-norm (norm(x + sublayer(x))); torch's `bias=False` drops every bias row
(linear and LayerNorm alike). Other settings: `layer_norm_eps` ↔ `norm_eps`;
activation "relu"/"gelu" (or an `nn.Module`, copied) ↔ `ff.fn.act`; dropouts
`self_attn.dropout` ↔ `attn.fn.attend.dropout`, `dropout1`/`dropout2` ↔
`attn.drop`/`ff.drop`, `dropout` ↔ `ff.fn.drop`. attnkit is batch first, (B, N, C):
a sequence-first layer (`batch_first=False`, torch's default) is refused unless
`batch_first=True` acknowledges the change of layout (see `torch_nn`); `to_torch`
gives back the layout the block came from, or the one asked for.

Masks: torch's `src_key_padding_mask` (B, N) and boolean `src_mask` (N, N)
mean True = *ignore*; a float `src_mask` is additive. `encoder_mask_from_torch`
turns both into one attnkit boolean mask (float masks must hold only 0 and
-inf, since `EncoderBlock` takes no bias); `causal=True` equals torch's
`generate_square_subsequent_mask`.

A fully padded sequence: attnkit gives each of its query rows attention
output 0. torch (2.13) gives the same on its regular path, but its inference
fast path (eval mode, no autograd, batch_first) returns NaN for the whole
sequence.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.convert._state import load_by_table, load_exact
from attnkit.convert.torch_nn import check_batch_first, mha_to_torch
from attnkit.functional import masks as _masks
from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.blocks import EncoderBlock, FeedForward, PreNormResidual
from attnkit.modules.projection import FusedQKV

__all__ = [
    "ENCODER_TABLE",
    "encoder_from_torch",
    "encoder_mask_from_torch",
    "encoder_to_torch",
    "load_torch_encoder_state",
]

ENCODER_TABLE = {
    "self_attn.in_proj_weight": "attn.fn.in_proj.qkv.weight",
    "self_attn.in_proj_bias": "attn.fn.in_proj.qkv.bias",
    "self_attn.out_proj.weight": "attn.fn.proj.weight",
    "self_attn.out_proj.bias": "attn.fn.proj.bias",
    "norm1.weight": "attn.norm.weight",
    "norm1.bias": "attn.norm.bias",
    "linear1.weight": "ff.fn.fc1.weight",
    "linear1.bias": "ff.fn.fc1.bias",
    "linear2.weight": "ff.fn.fc2.weight",
    "linear2.bias": "ff.fn.fc2.bias",
    "norm2.weight": "ff.norm.weight",
    "norm2.bias": "ff.norm.bias",
}


def _dropout(p: float) -> nn.Module:
    return nn.Dropout(p) if p > 0 else nn.Identity()


def _p(m: nn.Module) -> float:
    return m.p if isinstance(m, nn.Dropout) else 0.0


def load_torch_encoder_state(block: EncoderBlock, state: dict[str, Tensor]) -> EncoderBlock:
    """Copy a `TransformerEncoderLayer` state dict into `block`, exactly; returns `block`.

    Raises ValueError naming every missing, unexpected or mis-shaped key.
    """
    return load_by_table(block, state, ENCODER_TABLE, source="load_torch_encoder_state")


def _activation_from_torch(act) -> str | nn.Module:
    if act is F.relu:
        return "relu"
    if act is F.gelu:
        return "gelu"
    if isinstance(act, nn.Module):
        return copy.deepcopy(act)
    raise ValueError(
        f"from_torch: activation {act!r} is neither relu, gelu nor an nn.Module; "
        "wrap it in an nn.Module"
    )


def encoder_from_torch(
    layer: nn.TransformerEncoderLayer, *, batch_first: bool | None = None
) -> EncoderBlock:
    """An `attnkit.EncoderBlock` with exactly the weights and settings of `layer`.

    The block reads (B, N, C): a sequence-first `layer` is refused (ValueError naming
    `batch_first`) unless `batch_first=True` says you will transpose its inputs.
    """
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise ValueError(f"expected torch.nn.TransformerEncoderLayer, got {type(layer).__name__}")
    sa = layer.self_attn
    check_batch_first("nn.TransformerEncoderLayer", sa.batch_first, batch_first)
    if sa.bias_k is not None or sa.add_zero_attn or not sa._qkv_same_embed_dim:
        raise ValueError(
            "from_torch: self_attn with add_bias_kv/add_zero_attn/kdim is not standard"
        )
    c, hidden = layer.linear1.in_features, layer.linear1.out_features
    bias = layer.linear1.bias is not None
    eps = layer.norm1.eps
    ref = layer.linear1.weight
    block = EncoderBlock(
        c,
        sa.num_heads,
        hidden,
        norm_first=layer.norm_first,
        activation=_activation_from_torch(layer.activation),
        norm_eps=eps,
        attn=MultiHeadAttention(c, sa.num_heads, qkv_bias=bias, out_bias=bias, dropout=sa.dropout),
    )
    if not bias:  # torch's bias=False also drops the LayerNorm and feed-forward biases
        block.ff.fn = FeedForward(c, hidden, activation=block.ff.fn.act, bias=False)
        block.attn.norm = nn.LayerNorm(c, eps=eps, bias=False)
        block.ff.norm = nn.LayerNorm(c, eps=eps, bias=False)
    block.attn.drop, block.ff.drop = _dropout(layer.dropout1.p), _dropout(layer.dropout2.p)
    block.ff.fn.drop = _dropout(layer.dropout.p)
    block = block.to(device=ref.device, dtype=ref.dtype)
    block._torch_batch_first = bool(sa.batch_first)  # read by encoder_to_torch only
    return load_torch_encoder_state(block, {k: v.detach() for k, v in layer.state_dict().items()})


def _activation_to_torch(act: nn.Module):
    if type(act) is nn.ReLU:
        return "relu"
    if type(act) is nn.GELU and act.approximate == "none":
        return "gelu"
    return copy.deepcopy(act)


def _check_layer(
    peer: str, attns: list[nn.Module], ff: nn.Module, norms: tuple[nn.Module, ...]
) -> tuple[list[nn.MultiheadAttention], bool]:
    """torch copies of `attns` and the one bias flag; ValueError naming what torch cannot hold."""
    problems = [
        f"attention {type(a).__name__} is not a MultiHeadAttention with one (3C, C) projection"
        for a in attns
        if not isinstance(a, MultiHeadAttention) or not isinstance(a.in_proj, FusedQKV)
    ]
    if not isinstance(ff, FeedForward):
        problems.append(f"feed-forward {type(ff).__name__} is not attnkit's FeedForward")
    if not all(isinstance(n, nn.LayerNorm) and n.elementwise_affine for n in norms):
        problems.append("norms are not affine nn.LayerNorm")
    elif len({n.eps for n in norms}) != 1:
        problems.append(f"the LayerNorm eps differ {tuple(n.eps for n in norms)}")
    if problems:
        raise ValueError(f"to_torch: {peer} cannot express " + "; ".join(problems))
    torch_attns = [mha_to_torch(a) for a in attns]  # raises for GQA, out_dim, scale, ...
    biases = {m.bias is not None for m in (ff.fc1, ff.fc2, *norms)}
    biases |= {a.proj.bias is not None for a in attns}
    if len(biases) != 1:
        raise ValueError(f"to_torch: {peer} has one bias flag; some biases are absent")
    if ff.fc2.out_features != ff.fc1.in_features:
        raise ValueError(
            f"to_torch: feed-forward output width {ff.fc2.out_features} != {ff.fc1.in_features}"
        )
    return torch_attns, biases.pop()


def encoder_to_torch(
    block: EncoderBlock, *, batch_first: bool | None = None
) -> nn.TransformerEncoderLayer:
    """A `torch.nn.TransformerEncoderLayer` with exactly the weights and settings of `block`.

    `batch_first` defaults to the layout of the layer `block` came from (True for a block
    built in attnkit).
    """
    if batch_first is None:
        batch_first = getattr(block, "_torch_batch_first", True)
    attn, ff = block.attn.fn, block.ff.fn
    norms = (block.attn.norm, block.ff.norm)
    (torch_attn,), bias = _check_layer("TransformerEncoderLayer", [attn], ff, norms)
    ref = ff.fc1.weight
    layer = nn.TransformerEncoderLayer(
        ff.fc1.in_features,
        attn.num_heads,
        ff.fc1.out_features,
        dropout=_p(block.attn.drop),
        activation=_activation_to_torch(ff.act),
        layer_norm_eps=norms[0].eps,
        batch_first=batch_first,
        norm_first=isinstance(block.attn, PreNormResidual),
        bias=bias,
        device=ref.device,
        dtype=ref.dtype,
    )
    layer.self_attn.dropout = torch_attn.dropout
    layer.dropout.p, layer.dropout2.p = _p(ff.drop), _p(block.ff.drop)
    inverse = {v: k for k, v in ENCODER_TABLE.items()}
    state = {inverse[k]: v.detach() for k, v in block.state_dict().items()}
    load_exact(layer, state, source="to_torch")
    return layer


def encoder_mask_from_torch(
    src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None
) -> Tensor | None:
    """torch's `src_mask` (N, N) and `src_key_padding_mask` (B, N) → attnkit mask.

    Returns a boolean mask, True = may attend, broadcastable to (B, 1, N, N),
    or None. Float masks must hold only 0 (attend) and -inf (blocked).
    """
    parts = []
    for name, m in (("src_mask", src_mask), ("src_key_padding_mask", src_key_padding_mask)):
        if m is None:
            continue
        if m.dtype.is_floating_point:
            if not bool(((m == 0) | torch.isneginf(m)).all()):
                raise ValueError(
                    f"{name}: a float mask with values other than 0 and -inf is a bias; "
                    "EncoderBlock takes boolean masks only"
                )
            m = torch.isneginf(m)  # True = blocked, torch's boolean polarity
        if name == "src_mask":
            parts.append(_masks.from_torch_attn_mask(m))
        else:
            parts.append(_masks.from_torch_key_padding_mask(m))
    return _masks.combine(*parts)


# --------------------------------------------------------------------------- decoder
