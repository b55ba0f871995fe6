"""Calling FlexAttention-style index functions (``mask_mod(b, h, q_idx, kv_idx)``) on a block.

Legend: B batch, H heads; one block of nq query rows and nk keys.

FlexAttention calls a mask_mod once per element, under ``torch.vmap``, with 0-d int32 index
tensors. attnkit evaluates a whole block at once instead: the function gets broadcastable
int32 index tensors b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, nq, 1), kv_idx (1, 1, 1, nk),
which is what the attention-gym mask_mods (comparisons, ``&``, ``|``, ``torch.where``,
indexing into captured tensors) are written for. A function that only works one element at a
time (it calls ``torch.stack`` on its arguments, reduces over them, ...) is detected on its
first block — it raises there, returns something that is not a boolean of the block's shape,
or disagrees with its per-element values on a few sampled entries — and is then called per
element under nested ``torch.vmap``, block by block, as FlexAttention does. Either way only
one block of booleans exists at a time, never N × S.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["IndexFn", "ScoreFn", "per_element"]

_SAMPLE = 4  # rows and keys of a block compared between the two ways of calling

# The way each function was found to need ("vectorised" or "vmap"), so that a mask_mod or
# score_mod passed at every training step is checked once. Weak: the record goes with the
# function.
_MODES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _known_mode(fn) -> str | None:
    try:
        return _MODES.get(fn)
    except TypeError:  # not weak-referenceable
        return None


def _remember(fn, mode: str) -> str:
    with contextlib.suppress(TypeError):  # not weak-referenceable: checked at each call
        _MODES[fn] = mode
    return mode


class IndexFn:
    """A mask_mod ``fn(b, h, q_idx, kv_idx) -> bool`` evaluated block by block.

    The way of calling it (vectorised or per element) is decided on the first block and kept."""

    def __init__(self, fn: Callable, batch: int, heads: int, device, what: str = "mask_mod"):
        if not callable(fn):
            raise ValueError(f"{what} must be callable, got {type(fn).__name__}")
        self.fn, self.batch, self.heads, self.what = fn, batch, heads, what
        self.device = torch.device(device)
        self.mode: str | None = _known_mode(fn)  # "vectorised" or "vmap" once known

    def __call__(self, i0: int, i1: int, j0: int, j1: int) -> Tensor:
        """The booleans of rows i0:i1, keys j0:j1: (B|1, H|1, i1-i0, j1-j0)."""
        idx = self._indices(i0, i1, j0, j1)
        shape = (self.batch, self.heads, i1 - i0, j1 - j0)
        if self.mode == "vmap":
            return self._per_element(*idx)
        if self.mode == "vectorised":
            return self._checked(self.fn(*idx), shape)
        return self._first(idx, shape)

    def _indices(self, i0, i1, j0, j1) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        def ar(a, b):
            return torch.arange(a, b, dtype=torch.int32, device=self.device)

        return (
            ar(0, self.batch)[:, None, None, None],  # (B, 1, 1, 1)
            ar(0, self.heads)[None, :, None, None],  # (1, H, 1, 1)
            ar(i0, i1)[None, None, :, None],  # (1, 1, nq, 1)
            ar(j0, j1)[None, None, None, :],  # (1, 1, 1, nk)
        )

    def _first(self, idx, shape) -> Tensor:
        """Try the vectorised call, check it against per-element calls on a sample."""
        try:
            got = self._checked(self.fn(*idx), shape)
        except Exception as vec_error:  # any failure means: call per element
            try:
                out = self._per_element(*idx)
            except Exception as vmap_error:
                raise self._error(vec_error, vmap_error) from vmap_error
            self.mode = _remember(self.fn, "vmap")
            return out
        sample = tuple(t[..., :_SAMPLE, :] if t.shape[2] > 1 else t for t in idx)
        sample = tuple(t[..., :_SAMPLE] if t.shape[3] > 1 else t for t in sample)
        try:
            expected = self._per_element(*sample)
        except Exception:  # vmap cannot run it: the vectorised call stands
            self.mode = _remember(self.fn, "vectorised")
            return got
        if torch.equal(got[:, :, :_SAMPLE, :_SAMPLE], expected):
            self.mode = _remember(self.fn, "vectorised")
            return got
        self.mode = _remember(self.fn, "vmap")  # written for scalars: vectorised means else
        return self._per_element(*idx)

    def _checked(self, got, shape) -> Tensor:
        if not isinstance(got, Tensor) or got.dtype != torch.bool:
            kind = got.dtype if isinstance(got, Tensor) else type(got).__name__
            raise TypeError(f"{self.what} must return a boolean tensor, got {kind}")
        try:
            return got.expand(shape)
        except RuntimeError:
            raise TypeError(
                f"{self.what} returned shape {tuple(got.shape)}, which does not broadcast to the "
                f"block's {shape}"
            ) from None

    def _per_element(self, b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        out = per_element(self.fn, b, h, q, kv)
        return self._checked(out, (b.shape[0], h.shape[1], q.shape[2], kv.shape[3]))

    def _error(self, vec_error: Exception, vmap_error: Exception) -> ValueError:
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return ValueError(
            f"{self.what} {name!r} could not be evaluated. attnkit calls it vectorised, on "
            "broadcastable int32 index tensors b (B, 1, 1, 1), h (1, H, 1, 1), "
            "q_idx (1, 1, nq, 1), kv_idx (1, 1, 1, nk), where it raised "
            f"{type(vec_error).__name__}: {vec_error}; "
            "then per element under torch.vmap (as FlexAttention does), where it raised "
            f"{type(vmap_error).__name__}: {vmap_error}. Write it with tensor operations "
            "(comparisons, &, |, torch.where, indexing into captured tensors), without Python "
            "if/and/or on index values, and return a boolean tensor"
        )


def per_element(fn: Callable, *args: Tensor) -> Tensor:
    """FlexAttention's way of calling `fn`: once per element under torch.vmap, each argument a
    0-d tensor. The arguments are broadcast against each other (one block) and flattened."""
    full = torch.broadcast_tensors(*args)
    flat = [t.reshape(-1) for t in full]
    return torch.vmap(fn)(*flat).view(full[0].shape)


class ScoreFn:
    """A score_mod ``fn(score, b, h, q_idx, kv_idx)`` as FlexAttention users write it: called
    vectorised on a block (attnkit's way) and, if that raises or disagrees with per-element
    calls on a few sampled entries on its first block, per element under vmap (Flex's way) from
    then on. Gradients flow through either, into the tensors it closes over."""

    def __init__(self, fn: Callable):
        self.fn, self.mode = fn, _known_mode(fn)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor):
        args = (score, b, h, q_idx, kv_idx)
        if self.mode == "vmap":
            return per_element(self.fn, *args)
        if self.mode == "vectorised":
            return self.fn(*args)
        try:
            got = self.fn(*args)
        except Exception as vec_error:  # any failure means: try per element
            try:
                out = per_element(self.fn, *args)
            except Exception as vmap_error:
                raise _score_error(self.__name__, vec_error, vmap_error) from vmap_error
            self.mode = _remember(self.fn, "vmap")
            return out
        self.mode = _remember(self.fn, "vectorised" if _agrees(self.fn, got, args) else "vmap")
        return got if self.mode == "vectorised" else per_element(self.fn, *args)


def _agrees(fn: Callable, got, args) -> bool:
    """Whether a vectorised result equals per-element calls on the block's first 4 × 4 entries
    (True when vmap cannot run the function: the vectorised call then stands)."""
    if not isinstance(got, Tensor):
        return True  # the caller's checks name what is wrong
    with torch.no_grad():
        full = torch.broadcast_tensors(*args)
        sample = [t[..., :_SAMPLE, :_SAMPLE] for t in full]
        try:
            want = per_element(fn, *sample)
        except Exception:  # vmap cannot run it: the vectorised call stands
            return True
        mine = got.expand(full[0].shape)[..., :_SAMPLE, :_SAMPLE]
        # not bit-equal: a vectorised tanh or exp may round its SIMD body and tail apart
        return bool(torch.allclose(mine, want.to(mine.dtype), rtol=1e-5, atol=1e-6, equal_nan=True))


def _score_error(name: str, vec_error: Exception, vmap_error: Exception) -> ValueError:
    return ValueError(
        f"score_mod {name!r} could not be evaluated. attnkit calls it vectorised, on a block of "
        "scores with broadcastable index tensors, where it raised "
        f"{type(vec_error).__name__}: {vec_error}; then per element under torch.vmap (as "
        f"FlexAttention does), where it raised {type(vmap_error).__name__}: {vmap_error}. "
        "Write it with tensor operations (arithmetic, torch.where, indexing into captured "
        "tensors), without Python if/and/or on values"
    )
