"""Keras's projection-free layers <-> attnkit: `keras.layers.AdditiveAttention` and
`keras.layers.Attention` (score modes "concat" and "dot") to and from
`attnkit.modules.AdditiveAttention` and `LuongAttention`. The weight table and the masking
differences are in `attnkit.convert.keras`, which exports these functions."""

from __future__ import annotations

import torch

from attnkit.convert._keras_vars import _assign, _keras, _require, _tensor
from attnkit.convert._state import load_exact
from attnkit.modules.additive import AdditiveAttention, LuongAttention

__all__ = ["additive_from_keras", "additive_to_keras", "luong_from_keras", "luong_to_keras"]


def additive_from_keras(layer) -> AdditiveAttention:
    """`keras.layers.AdditiveAttention`, or `Attention(score_mode="concat")` → AdditiveAttention."""
    keras = _keras()
    if isinstance(layer, keras.layers.AdditiveAttention):
        _require(layer, "AdditiveAttention", "additive_from_keras")
        ref = _tensor(layer.scale) if layer.use_scale else None
        dim = _built_dim(layer) if ref is None else ref.shape[0]
        dtype = ref.dtype if ref is not None else torch.float32
        v = ref if ref is not None else torch.ones(dim, dtype=dtype)
        inner = torch.ones((), dtype=dtype)
    else:
        _require(layer, "Attention", "additive_from_keras")
        if layer.score_mode != "concat":
            raise ValueError(
                'additive_from_keras: Attention(score_mode="dot") is multiplicative; '
                "use luong_from_keras"
            )
        w = _tensor(layer.concat_score_weight)
        inner = _tensor(layer.scale) if layer.use_scale else torch.ones((), dtype=w.dtype)
        v = w.expand(_built_dim(layer)).clone()
    ours = AdditiveAttention(v.shape[0], dropout=float(layer.dropout)).to(v.dtype)
    ours = load_exact(ours, {"v": v, "inner_scale": inner}, source="additive_from_keras")
    # read by additive_to_keras only, so a round trip gives back the same kind of layer
    concat = not isinstance(layer, keras.layers.AdditiveAttention)
    ours._keras_layer = ("concat" if concat else "additive", bool(layer.use_scale))
    return ours


def _built_dim(layer) -> int:
    # the Attention layers keep no record of their width when they own no vector
    shape = getattr(layer, "_build_shapes_dict", None) or {}
    for value in shape.values():
        return int(value[0][-1])
    raise ValueError(
        f"{type(layer).__name__} has no width-sized weight; build it with its input shapes"
    )


def additive_to_keras(ours: AdditiveAttention, *, layer: str | None = None):
    """AdditiveAttention without projections → Keras.

    `layer="additive"` gives `AdditiveAttention(use_scale=True)` with scale = v (needs
    inner_scale == 1); `layer="concat"` gives `Attention(score_mode="concat")` with
    scale = inner_scale and concat_score_weight = w (needs v = w·1). The default is the
    kind the module came from through `additive_from_keras` (same kind and use_scale),
    else "additive" when inner_scale == 1 and "concat" otherwise.
    """
    keras = _keras()
    origin, use_scale = getattr(ours, "_keras_layer", (None, True))
    if layer is None:
        layer = origin or ("additive" if bool(ours.inner_scale == 1) else "concat")
    if layer not in ("additive", "concat"):
        raise ValueError(f'to_keras: layer must be "additive" or "concat", got {layer!r}')
    if not isinstance(ours.q_proj, torch.nn.Identity):
        raise ValueError("to_keras: Keras's additive layers have no projections (hidden != None)")
    v, inner = ours.v.detach(), ours.inner_scale.detach()
    dtype = str(v.dtype).removeprefix("torch.")
    shapes = [(None, None, v.shape[0])] * 2
    if layer == "additive":
        if not bool(inner == 1):
            raise ValueError(
                "to_keras: Keras's AdditiveAttention has no inner scale; inner_scale != 1 "
                'needs layer="concat"'
            )
        additive = keras.layers.AdditiveAttention(
            use_scale=True, dropout=ours.attend.dropout, dtype=dtype
        )
        additive.build(shapes)
        _assign(additive.scale, v)
        return additive
    if not use_scale and not bool(inner == 1):
        use_scale = True  # the weights changed since conversion: keep them exact
    if not bool((v == v[0]).all()):
        raise ValueError(
            "to_keras: inner_scale != 1 needs v = w·ones (Keras's concat score mode), "
            "got a general v"
        )
    concat = keras.layers.Attention(
        use_scale=use_scale, score_mode="concat", dropout=ours.attend.dropout, dtype=dtype
    )
    concat.build(shapes)
    if use_scale:
        _assign(concat.scale, inner)
    _assign(concat.concat_score_weight, v[0])
    return concat


def luong_from_keras(layer) -> LuongAttention:
    """`keras.layers.Attention(score_mode="dot")` → LuongAttention (no `general` weight)."""
    _require(layer, "Attention", "luong_from_keras")
    if layer.score_mode != "dot" or isinstance(layer, _keras().layers.AdditiveAttention):
        raise ValueError("luong_from_keras: only score_mode='dot'; use additive_from_keras")
    scale = _tensor(layer.scale) if layer.use_scale else torch.ones(())
    ours = LuongAttention(dropout=float(layer.dropout)).to(scale.dtype)
    return load_exact(ours, {"scale": scale}, source="luong_from_keras")


def luong_to_keras(ours: LuongAttention):
    """LuongAttention without `general` → `keras.layers.Attention(use_scale=True)`."""
    keras = _keras()
    if not isinstance(ours.general, torch.nn.Identity):
        raise ValueError("to_keras: keras.layers.Attention has no general (bilinear) weight")
    scale = ours.scale.detach()
    layer = keras.layers.Attention(
        use_scale=True, dropout=ours.attend.dropout, dtype=str(scale.dtype).removeprefix("torch.")
    )
    layer.build([(None, None, 1)] * 2)
    _assign(layer.scale, scale)
    return layer
