"""Memory of the attention core: what a forward pass keeps for backward, and its peak.

Dimensions: B batch, H query heads, Hkv key/value heads, N query length,
S key length, D query/key head width, Dv value head width; E = B·H·N·S is the
number of attention scores.

What autograd keeps (checked in the tests by summing the distinct storages that
`torch.autograd.graph.saved_tensors_hooks` sees):

* ``reference`` — plain ``softmax(q·kᵀ·scale)·v``: the matmuls keep q, k, v and
  the softmax keeps its output, the (B, H, N, S) probabilities. K and V are
  counted at H heads: the reference repeats them for GQA, and the repeats are
  what the matmuls save. Dropout adds its mask and the dropped probabilities,
  two more E-sized tensors (on CPU the mask has the input's dtype, not bool).
* ``fused`` — torch SDPA's CPU flash kernel keeps q, k, v (at Hkv heads), the
  output and the log-sum-exp (B, H, N) in the accumulation type (float32, or
  float64 for float64 inputs): O(N), no E-sized tensor. With
  dropout, or Dv != D, SDPA leaves the flash kernel for its math path, which
  keeps what the reference keeps (in float32 for float16/bfloat16 inputs).
* ``chunked`` — attnkit's online-softmax backend keeps the same O(N) set as
  the flash kernel (q, k, v, out, lse), with or without dropout (it replays the
  dropout bits from a seed, an 8-byte tensor); its compiled CPU kernel keeps them in float32, the
  type it computes in, also for float16/bfloat16 inputs.

The forward peak counts tensors allocated during the forward beyond q, k, v,
at the moment most of them are alive; kernel scratch that does not grow with
N (the flash kernel's per-thread blocks) is left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BACKENDS", "Memory", "attention_memory", "score_matrix_bytes"]

BACKENDS = ("reference", "fused", "chunked")


@dataclass(frozen=True)
class Memory:
    """Bytes of one attention call (training mode)."""

    # bytes kept for backward, per saved tensor (q, k, v, probs, ..., lse)
    saved: dict[str, int]
    # largest number of bytes alive at once during forward, beyond q, k, v
    forward_peak: int

    @property
    def saved_bytes(self) -> int:
        return sum(self.saved.values())

    def to_dict(self) -> dict:
        return {
            "saved": dict(self.saved),
            "saved_bytes": self.saved_bytes,
            "forward_peak": self.forward_peak,
        }


def _itemsize(dtype: torch.dtype | str) -> int:
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"dtype must be a torch dtype name like 'float16', got {dtype!r}")
        dtype = resolved
    return dtype.itemsize


def score_matrix_bytes(
    batch: int, heads: int, n: int, s: int | None = None, dtype: torch.dtype | str = torch.float32
) -> int:
    """Bytes of one (B, H, N, S) score or probability matrix: B·H·N·S·itemsize."""
    return batch * heads * n * (n if s is None else s) * _itemsize(dtype)


def attention_memory(
    batch: int,
    heads: int,
    n: int,
    s: int | None = None,
    head_dim: int = 64,
    *,
    kv_heads: int | None = None,
    v_dim: int | None = None,
    dtype: torch.dtype | str = torch.float32,
    backend: str = "reference",
    dropout: bool = False,
) -> Memory:
    """Saved-for-backward and forward-peak bytes of one attention call (module docstring).

    Args:
        batch, heads, n, s, head_dim: B, H, N, S (default N), D.
        kv_heads: Hkv (default H).
        v_dim: Dv (default D).
        dtype: of q, k, v (the log-sum-exp is at least float32).
        backend: "reference", "fused" or "chunked".
        dropout: dropout on the probabilities is active (training).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    s = n if s is None else s
    hkv = heads if kv_heads is None else kv_heads
    dv = head_dim if v_dim is None else v_dim
    item = _itemsize(dtype)
    # SDPA's CPU flash kernel needs Dv == D and no dropout; otherwise its math
    # path runs, in float32 for half-precision inputs.
    math_path = backend == "fused" and (dropout or dv != head_dim)
    if math_path:
        item = max(item, 4)
    e = batch * heads * n * s * item  # one (B, H, N, S) matrix
    out = batch * heads * n * dv * item
    q = batch * heads * n * head_dim * item

    if backend == "reference" or math_path:
        saved = {
            "q": q,
            "k": batch * heads * s * head_dim * item,  # at H heads (repeated under GQA)
            "v": batch * heads * s * dv * item,
            "probs": e,
        }
        if dropout:
            saved["dropout_mask"] = e
            saved["dropped_probs"] = e
        # GQA repeats of k and v are new tensors; unscaled and scaled scores are
        # both alive while the scale is applied, then scaled scores and probs
        # while softmax runs; dropout then holds probs, mask and dropped probs.
        repeats = (saved["k"] + saved["v"]) if hkv != heads else 0
        peak = repeats + max(2 * e, (3 * e if dropout else e) + out)
        return Memory(saved, peak)

    if backend == "chunked":  # the compiled kernel saves its float32 working copies
        item = max(item, 4)
        out, q = batch * heads * n * dv * item, batch * heads * n * head_dim * item
    lse = batch * heads * n * max(item, 4)  # (B, H, N) in the accumulation type
    saved = {
        "q": q,
        "k": batch * hkv * s * head_dim * item,
        "v": batch * hkv * s * dv * item,
        "out": out,
        "lse": lse,
    }
    if backend == "chunked" and dropout:
        saved["seed"] = 8  # the 0-d int64 seed that replays the dropout bits
    return Memory(saved, out + lse)
