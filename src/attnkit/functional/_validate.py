"""Input checks of `attnkit.attention`: every refusal names the argument, its shape and the
shape wanted (B batch, H query heads, Hkv key/value heads, N queries, S keys, D head width)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.functional.structured import StructuredMask

__all__ = ["validate"]


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(str(d) for d in t.shape) + ")"


def _refuse_ambiguous(name: str, t: Tensor, full: tuple[int, int, int, int]) -> None:
    """Refuse a 2-D or 3-D mask/bias whose leading dim could be the batch.

    Broadcasting reads (X, S) as (N, S) and (X, N, S) as (H, N, S). A Hugging Face / torch
    key-padding mask (B, S) with B == N, or a Keras (B, N, S) mask with B == H, broadcasts
    without error and means something else: refused, with the 4-D spelling of each reading.
    """
    b, h, n, _ = full
    lead = t.shape[0] if t.dim() in (2, 3) else 1
    if lead == 1 or lead != b:
        return
    if t.dim() == 2 and b == n:
        raise ValueError(
            f"{name} of shape {_shape(t)} is ambiguous with B = N = {b}: broadcasting reads it "
            f"as (N, S), but it may be a (B, S) key-padding mask. Pass it 4-D: "
            f"{name}[:, None, None, :] for (B, S) (or attnkit.masks.from_hf_attention_mask), "
            f"{name}[None, None] for (N, S)"
        )
    if t.dim() == 3 and b == h:
        raise ValueError(
            f"{name} of shape {_shape(t)} is ambiguous with B = H = {b}: broadcasting reads it "
            f"as (H, N, S), but it may be a (B, N, S) mask (Keras' convention). Pass it 4-D: "
            f"{name}[:, None] for (B, N, S), {name}[None] for (H, N, S)"
        )


def validate(q, k, v, mask, bias, dropout_p, scale) -> None:
    wanted = {"q": "(B, H, N, D)", "k": "(B, Hkv, S, D)", "v": "(B, Hkv, S, Dv)"}
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a tensor {wanted[name]}, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape {wanted[name]}, got {_shape(t)}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating tensor, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
    b, h, n, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k must have shape (B={b}, Hkv, S, D={d}), got {_shape(k)}")
    if v.shape[:3] != k.shape[:3]:
        want = f"(B={b}, Hkv={k.shape[1]}, S={k.shape[2]}, Dv)"
        raise ValueError(f"v must have shape {want}, got {_shape(v)}")
    if d == 0:
        raise ValueError(f"q and k must have a head width D >= 1, got q {_shape(q)}, k {_shape(k)}")
    hkv = k.shape[1]
    if (hkv == 0 and h > 0) or (hkv > 0 and h % hkv):
        raise ValueError(
            f"query heads H={h} must be a multiple of key/value heads Hkv={k.shape[1]} "
            f"(q {_shape(q)}, k {_shape(k)})"
        )
    full = (b, h, n, k.shape[2])
    if isinstance(mask, StructuredMask):
        _check_structured(mask, full)
        mask = None
    for name, t, kind in (("mask", mask, "bool"), ("bias", bias, "float")):
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a tensor or None, got {type(t).__name__}")
        if kind == "bool" and t.dtype != torch.bool:
            raise ValueError(
                f"mask must be boolean (True = may attend), got {t.dtype} {_shape(t)}; "
                "pass additive float scores as bias=, or convert with attnkit.masks"
            )
        if kind == "float" and not t.dtype.is_floating_point:
            raise ValueError(f"bias must be a floating tensor, got {t.dtype} {_shape(t)}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on {q.device}, got {t.device}")
        if not _broadcasts_to(t.shape, full):
            raise ValueError(
                f"{name} of shape {_shape(t)} does not broadcast to (B, H, N, S) = {full}"
            )
        _refuse_ambiguous(name, t, full)
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if scale is not None and not (
        float(scale) == float(scale) and abs(float(scale)) < float("inf")
    ):
        raise ValueError(f"scale must be a finite number, got {scale}")


def _check_structured(mask: StructuredMask, full: tuple[int, int, int, int]) -> None:
    """A structured mask must describe (B|1, H|1, N, S) exactly: its N and S are sizes it was
    built for (a window or document layout of another length means something else)."""
    b, h, n, s = full
    mb, mh, mn, ms = mask.shape
    if (mn, ms) != (n, s) or mb not in (1, b) or mh not in (1, h):
        raise ValueError(
            f"mask {mask.describe()} describes (B, H, N, S) = {mask.shape}, which does not fit "
            f"the call's {full}: build it for N={n} queries and S={s} keys"
        )


def _broadcasts_to(shape: tuple, full: tuple) -> bool:
    """True if `shape` broadcasts to `full` (and the result is `full`), size by size.

    Not torch.broadcast_shapes: it imports sympy on its first call (~0.7 s of a CLI start),
    and with symbolic sizes (torch.compile's automatic dynamic shapes) it refuses a static
    mask size against a dynamic batch instead of guarding on their equality. Here a static
    3 against a dynamic batch s0 adds the guard s0 == 3, which is what the call means.
    """
    if len(shape) > len(full):
        return False
    return all(d == 1 or d == f for d, f in zip(reversed(shape), reversed(full), strict=False))
