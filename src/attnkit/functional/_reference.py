"""The reference backend of `attnkit.attention` (plain matmul + softmax in float32, the only one
that returns the probabilities) and the small helpers every backend shares.

Dimensions as in `attnkit.functional.attention`: B batch, H query heads, Hkv key/value heads,
N queries, S keys, D head width, Dv value head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.functional import masks as _masks
from attnkit.functional import score_mods as _score_mods
from attnkit.functional._trace import tracing as _tracing

__all__ = ["reference"]


def _eager_cpu(t: Tensor) -> bool:
    """Whether a data-dependent shortcut (reading a tensor's values on the host) is cheap and
    safe: eager mode on the CPU. Elsewhere the branch-free path runs (no host sync on CUDA, one
    graph under compile and export, the right answer for every input under jit.trace)."""
    return t.is_cpu and not _tracing()


def _allowed(mask: Tensor | None, causal: bool, n: int, s: int, device) -> Tensor | None:
    """The boolean "may attend" mask that combines `mask` and `causal`."""
    return _masks.combine(mask, _masks.causal(n, s, device=device) if causal else None)


def _repeat_kv(t: Tensor, heads: int) -> Tensor:
    """(B, Hkv, S, X) -> (B, H, S, X): query head h reads kv head h // (H // Hkv)."""
    groups = heads // t.shape[1] if t.shape[1] else 1  # H = Hkv = 0: nothing to repeat
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _scaled_copy(q: Tensor, scale: float, dtype: torch.dtype) -> Tensor:
    """scale * q as a fresh contiguous tensor of `dtype`, in one pass where it can."""
    if q.requires_grad or _tracing():
        return (q.to(dtype) * scale).contiguous()
    # no graph: ``out=`` writes the cast and the product at once
    return torch.mul(q, scale, out=torch.empty(q.shape, dtype=dtype, device=q.device))


def reference(q, k, v, mask, bias, causal, scale, dropout_p, need_weights, score_mod=None):
    """The reference backend: (out, weights or None, lse or None), as `AttentionOutput` holds.

    `score_mod` is applied to the whole (B, H, N, S) score tensor (the truth the blocked
    backends are tested against), then bias and masks, out of place: the function's backward
    may need its output."""
    work = torch.promote_types(q.dtype, torch.float32)
    heads, n, s = q.shape[1], q.shape[2], k.shape[2]
    kw = _repeat_kv(k, heads).to(work)  # (B, H, S, D)
    vw = _repeat_kv(v, heads).to(work)  # (B, H, S, Dv)
    # scale q (N·D) rather than the scores (N·S), straight into the contiguous copy bmm needs
    qs = _scaled_copy(q, scale, work)
    scores = torch.matmul(qs, kw.transpose(-2, -1))  # (B, H, N, S)
    if score_mod is not None:
        idx = _score_mods.indices(q.shape[0], heads, 0, n, 0, s, q.device)
        scores = _score_mods.apply(score_mod, scores, *idx)
        if bias is not None:
            scores = scores + bias.to(work)
    elif bias is not None:
        scores = scores.add_(bias.to(work))
    allowed = _allowed(mask, causal, n, s, q.device)
    if allowed is not None:
        if score_mod is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        else:
            scores = scores.masked_fill_(~allowed, float("-inf"))
    # The weights hold lse (lse_i = s_ij - log p_ij), so a call that asks for them skips it;
    # torch's MHA computes neither (this keeps record_attention at its speed).
    want_lse = not need_weights
    with torch.no_grad():  # row max; -inf where a row sees nothing (masked, or -inf scores)
        top = scores.amax(dim=-1, keepdim=True)  # (B, H, N, 1)
    dead = torch.isneginf(top)  # (B, H, N, 1)
    # On the CPU in eager mode, skip the fix-up when no row is dead (a pass over N×S saved).
    if _eager_cpu(q) and not bool(dead.any()):
        dead = None
    if dead is not None:
        # softmax of an all -inf row is NaN (and so is its gradient): give the
        # row finite scores, then zero its probabilities.
        scores = scores.masked_fill(dead, 0.0)
    if scores.requires_grad or _tracing():
        probs = torch.softmax(scores, dim=-1)
    else:
        # no graph: softmax in place. A fresh N×S output costs its page faults, ~3x the
        # softmax itself (1 thread, 8×8×512×512: 62 ms vs 19 ms); torch's MHA does the same.
        probs = torch.ops.aten._softmax.out(scores, -1, False, out=scores)
    if dead is not None:
        probs = probs.masked_fill(dead, 0.0)
    lse = None
    if want_lse:
        with torch.no_grad():
            # lse = s_j - log p_j for any j, taken at the row max (p_max >= 1/S, so the log is
            # well conditioned): two max passes instead of logsumexp's exp over all N×S scores.
            lse = (top - probs.amax(dim=-1, keepdim=True).log()).squeeze(-1)  # (B, H, N)
            lse = lse.masked_fill(torch.isneginf(top.squeeze(-1)), float("-inf"))
    kept = F.dropout(probs, dropout_p, training=True) if dropout_p > 0 else probs
    out = torch.matmul(kept, vw).to(q.dtype)  # (B, H, N, Dv)
    return out, probs.to(q.dtype) if need_weights else None, lse
