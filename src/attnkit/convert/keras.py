"""Keras 3 attention layers <-> attnkit (any Keras backend; weights travel as numpy).

`keras.layers.MultiHeadAttention` <-> `attnkit.MultiHeadAttention`
(H heads, D = Keras key_dim = attnkit head_dim, Dv = Keras value_dim = attnkit
v_head_dim, C query width, Ck key width, Cv value width, Co output width):

| Keras MultiHeadAttention            | attnkit: FusedQKV [SplitQKV] {SeparateQKV}
| ----------------------------------- | ------------------------------------------
| query/kernel (C, H, D)              | in_proj.qkv.weight[:HD] (HD, C) = kernel.flatten(1).T
|                                     | [in_proj.q.weight] {in_proj.q.weight}
| key/kernel (Ck, H, D)               | in_proj.qkv.weight[HD:2HD] [in_proj.kv.weight[:HD]]
|                                     | {in_proj.k.weight}
| value/kernel (Cv, H, Dv)            | in_proj.qkv.weight[2HD:] [in_proj.kv.weight[HD:]]
|                                     | {in_proj.v.weight}
| query/bias, key/bias (H, D),        | the flattened biases of the same rows
| value/bias (H, Dv)                  |
| attention_output/kernel (H, Dv, Co) | proj.weight (Co, H·Dv) = kernel.flatten(0, 1).T
| attention_output/bias (Co,)         | proj.bias (Co,)

HD = H·D. Ck == Cv == C gives `FusedQKV`, Ck == Cv != C `SplitQKV` (bracketed),
Ck != Cv `SeparateQKV` (braced). Head h of Keras is rows h·D .. (h+1)·D - 1 of
attnkit's projections, the order in which attnkit splits heads. Keras scales
scores by 1/sqrt(key_dim), attnkit's default. Keras calls `layer(query, value,
key)`; attnkit `mha(query, key, value)`.

Refused, because attnkit's module cannot express them: `use_gate`,
`sliding_window` (pass `attnkit.masks.window` as a mask instead),
`attention_axes` other than the sequence axis, and `output_shape` with more than
one dimension; to Keras: GQA and a module without output projection.

Masks. Keras's `attention_mask` is `(B, N, S)` with 1 = attend: convert with
`attnkit.masks.from_keras_attention_mask`. Keras's `use_causal_mask` is aligned
top-left (query i sees keys j <= i); attnkit's `causal=True` is aligned
bottom-right — identical when N == S; for N != S pass `keras_causal(n, s)` as a
mask. A query row that may attend to nothing: attnkit gives attention output
0; Keras gives 0 when it computes scores (`return_attention_scores=True` or
dropout) but, on its fused path, the *mean of all values* (it masks with a
large negative number, which makes such a row uniform).

`keras.layers.AdditiveAttention` and `keras.layers.Attention` have no
projections, only scalars or a vector; they map to `attnkit.modules.AdditiveAttention`
(no `hidden`) and `attnkit.modules.LuongAttention` (no `general`):

| Keras                                   | attnkit                                      |
| --------------------------------------- | -------------------------------------------- |
| AdditiveAttention: scale (C,)           | AdditiveAttention.v (C,); inner_scale = 1    |
| AdditiveAttention(use_scale=False)      | v = ones(C); inner_scale = 1                 |
| Attention("concat"): concat_score_weight () | AdditiveAttention.v = weight · ones(C)   |
| Attention("concat"): scale ()           | AdditiveAttention.inner_scale (1 without)    |
| Attention("dot"): scale ()              | LuongAttention.scale () (1 without)          |

Keras's value masks there add -1e9 (a fully masked row becomes uniform over
all values); attnkit gives such rows output 0. Keras's query_mask zeroes the
output rows: in attnkit, make those mask rows all False (`keras_masks`).

The converters of these two layers live in `attnkit.convert._keras_additive`, the Keras
access they share with the ones here in `attnkit.convert._keras_vars`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.convert._keras_additive import (
    additive_from_keras,
    additive_to_keras,
    luong_from_keras,
    luong_to_keras,
)
from attnkit.convert._keras_vars import _assign, _keras, _require, _tensor
from attnkit.convert._state import Shape, check_state, load_exact
from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.projection import FusedQKV, SeparateQKV, SplitQKV

__all__ = [
    "additive_from_keras",
    "additive_to_keras",
    "keras_causal",
    "keras_masks",
    "load_keras_mha_state",
    "luong_from_keras",
    "luong_to_keras",
    "mha_from_keras",
    "mha_keras_state",
    "mha_to_keras",
]

_PARTS = ("query", "key", "value", "attention_output")


# --------------------------------------------------------------------------- MultiHeadAttention


def mha_keras_state(layer) -> dict[str, Tensor]:
    """The weights of a built `keras.layers.MultiHeadAttention`, named "query/kernel" etc."""
    state = {}
    for part in _PARTS:
        dense = getattr(layer, f"{part}_dense" if part != "attention_output" else "output_dense")
        state[f"{part}/kernel"] = _tensor(dense.kernel)
        if dense.bias is not None:
            state[f"{part}/bias"] = _tensor(dense.bias)
    return state


def _keras_shapes(ours: MultiHeadAttention) -> dict[str, Shape]:
    h, d, dv, co = ours.num_heads, ours.head_dim, ours.v_head_dim, ours.out_dim
    wanted: dict[str, Shape] = {
        "query/kernel": (ours.dim, h, d),
        "key/kernel": (ours.in_proj.key_dim, h, d),
        "value/kernel": (ours.in_proj.value_dim, h, dv),
        "attention_output/kernel": (h, dv, co),
    }
    if _in_bias(ours):
        wanted.update({"query/bias": (h, d), "key/bias": (h, d), "value/bias": (h, dv)})
    if "proj.bias" in ours.state_dict():
        wanted["attention_output/bias"] = (co,)
    return dict(sorted(wanted.items()))


# attnkit's packed input projections: which Keras parts each one holds, in row order
_PACKED = {
    FusedQKV: {"qkv": ("query", "key", "value")},
    SplitQKV: {"q": ("query",), "kv": ("key", "value")},
    SeparateQKV: {"q": ("query",), "k": ("key",), "v": ("value",)},
}


def _in_bias(ours: MultiHeadAttention) -> bool:
    return any(k.startswith("in_proj.") and k.endswith(".bias") for k in ours.state_dict())


def load_keras_mha_state(ours: MultiHeadAttention, state: dict[str, Tensor]) -> MultiHeadAttention:
    """Copy Keras-named weights (`mha_keras_state`) into `ours`, exactly; returns `ours`.

    Raises ValueError naming every missing, unexpected or mis-shaped key.
    """
    if not isinstance(ours.proj, torch.nn.Linear):
        raise ValueError("load_keras_mha_state: the module has no output projection (out_proj)")
    check_state(state, _keras_shapes(ours), source="load_keras_mha_state")

    def w(part: str) -> Tensor:  # (Cin, H, D) -> (H·D, Cin)
        return state[f"{part}/kernel"].flatten(1).T

    def b(part: str) -> Tensor:  # (H, D) -> (H·D,)
        return state[f"{part}/bias"].flatten()

    ref = ours.proj.weight
    new: dict[str, Tensor] = {"proj.weight": state["attention_output/kernel"].flatten(0, 1).T}
    if ours.proj.bias is not None:
        new["proj.bias"] = state["attention_output/bias"]
    bias = _in_bias(ours)
    for name, parts in _PACKED[type(ours.in_proj)].items():
        new[f"in_proj.{name}.weight"] = torch.cat([w(p) for p in parts])
        if bias:
            new[f"in_proj.{name}.bias"] = torch.cat([b(p) for p in parts])
    new = {k: v.to(device=ref.device, dtype=ref.dtype) for k, v in new.items()}
    return load_exact(ours, new, source="load_keras_mha_state")


def mha_from_keras(layer) -> MultiHeadAttention:
    """An `attnkit.MultiHeadAttention` with exactly the weights of a built Keras layer."""
    _require(layer, "MultiHeadAttention", "from_keras")
    problems = []
    if getattr(layer, "_use_gate", False):
        problems.append("use_gate=True")
    if getattr(layer, "_sliding_window", None) is not None:
        problems.append("sliding_window (pass attnkit.masks.window as a mask instead)")
    if tuple(layer.attention_axes or (1,)) != (1,):
        problems.append(f"attention_axes={layer.attention_axes} (only the sequence axis)")
    out_shape = getattr(layer, "_output_shape", None)
    if out_shape is not None and len(out_shape) != 1:
        problems.append(f"output_shape={out_shape} has more than one dimension")
    state = mha_keras_state(layer)
    if problems:
        raise ValueError(
            "from_keras: attnkit.MultiHeadAttention cannot express " + "; ".join(problems)
        )
    ours = MultiHeadAttention(
        state["query/kernel"].shape[0],
        layer.num_heads,
        head_dim=layer.key_dim,
        v_head_dim=state["value/kernel"].shape[-1],
        out_dim=state["attention_output/kernel"].shape[-1],
        key_dim=state["key/kernel"].shape[0],
        value_dim=state["value/kernel"].shape[0],
        qkv_bias=layer.use_bias,
        out_bias=layer.use_bias,
        dropout=float(layer.dropout),
    ).to(state["query/kernel"].dtype)
    return load_keras_mha_state(ours, state)


def mha_to_keras(ours: MultiHeadAttention):
    """A built `keras.layers.MultiHeadAttention` with exactly our weights."""
    keras = _keras()
    problems = []
    if ours.dim is None:
        problems.append("dim is lazy (call the module once first)")
    if ours.num_kv_heads != ours.num_heads:
        problems.append(f"num_kv_heads={ours.num_kv_heads} != num_heads={ours.num_heads} (GQA)")
    if not isinstance(ours.proj, torch.nn.Linear):
        problems.append("no output projection (out_proj=False; Keras always has one)")
    elif _in_bias(ours) != (ours.proj.bias is not None):
        problems.append("qkv_bias != out_bias (Keras has one use_bias)")
    if ours.rotary is not None:
        problems.append("rotary positions (RoPE: Keras has no such option)")
    if ours.attend.scale is not None and ours.attend.scale != ours.head_dim**-0.5:
        problems.append(f"scale={ours.attend.scale} is not 1/sqrt(head_dim)")
    if problems:
        raise ValueError(
            "to_keras: keras.layers.MultiHeadAttention cannot express " + "; ".join(problems)
        )
    h, d, dv, c, co = ours.num_heads, ours.head_dim, ours.v_head_dim, ours.dim, ours.out_dim
    layer = keras.layers.MultiHeadAttention(
        num_heads=h,
        key_dim=d,
        value_dim=dv,
        dropout=ours.attend.dropout,
        use_bias=ours.proj.bias is not None,
        output_shape=None if co == c else (co,),
        dtype=str(ours.proj.weight.dtype).removeprefix("torch."),
    )
    # Keras builds (query, value, key)
    layer.build(
        (None, None, c), (None, None, ours.in_proj.value_dim), (None, None, ours.in_proj.key_dim)
    )
    sd = {k: v.detach() for k, v in ours.state_dict().items()}
    rows = {"query": h * d, "key": h * d, "value": h * dv}
    weights, biases = {}, {}
    for name, parts in _PACKED[type(ours.in_proj)].items():
        sizes = [rows[p] for p in parts]
        weights.update(zip(parts, sd[f"in_proj.{name}.weight"].split(sizes), strict=True))
        if f"in_proj.{name}.bias" in sd:
            biases.update(zip(parts, sd[f"in_proj.{name}.bias"].split(sizes), strict=True))
    for part, dense in zip(
        _PARTS[:3], (layer.query_dense, layer.key_dense, layer.value_dense), strict=True
    ):
        width = rows[part] // h
        _assign(dense.kernel, weights[part].T.reshape(-1, h, width))  # (H·D, Cin) -> (Cin, H, D)
        if biases:
            _assign(dense.bias, biases[part].reshape(h, width))
    _assign(
        layer.output_dense.kernel, sd["proj.weight"].T.reshape(h, dv, co)
    )  # (Co, H·Dv) -> (H, Dv, Co)
    if "proj.bias" in sd:
        _assign(layer.output_dense.bias, sd["proj.bias"])
    return layer


# --------------------------------------------------------------------------- masks


def keras_causal(n: int, s: int | None = None) -> Tensor:
    """Keras's `use_causal_mask` as a mask `(1, 1, N, S)`: query i sees keys j <= i (top-left)."""
    s = n if s is None else s
    return torch.ones(n, s, dtype=torch.bool).tril()[None, None]  # (1, 1, N, S)


def keras_masks(
    query_mask: Tensor | None = None,
    value_mask: Tensor | None = None,
    *,
    use_causal_mask: bool = False,
) -> Tensor | None:
    """Keras's query_mask `(B, N)` / value_mask `(B, S)` (True = real step) → mask `(B, 1, N, S)`.

    A masked query gets an all-False row (attnkit output 0, as Keras's zeroed
    output rows); a masked value is a key nobody attends. `use_causal_mask`
    adds Keras's top-left causal mask (needs both masks for the sizes).
    """
    parts = []
    if query_mask is not None:
        if query_mask.dim() != 2:
            raise ValueError(f"query_mask must have shape (B, N), got {tuple(query_mask.shape)}")
        parts.append(query_mask.bool()[:, None, :, None])  # (B, 1, N, 1)
    if value_mask is not None:
        if value_mask.dim() != 2:
            raise ValueError(f"value_mask must have shape (B, S), got {tuple(value_mask.shape)}")
        parts.append(value_mask.bool()[:, None, None, :])  # (B, 1, 1, S)
    if use_causal_mask:
        if query_mask is None or value_mask is None:
            raise ValueError(
                "keras_masks: use_causal_mask needs query_mask and value_mask for N, S"
            )
        parts.append(keras_causal(query_mask.shape[1], value_mask.shape[1]).to(value_mask.device))
    mask = None
    for p in parts:
        mask = p if mask is None else mask & p
    return mask
