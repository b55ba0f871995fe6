"""Exact higher-order gradients for the attention kernels whose backward autograd cannot
differentiate: the compiled CPU kernel (`native`), the PyTorch chunked kernel (in-place block
arithmetic) and SDPA's fused kernels.

Legend: B batch, H query heads, Hkv key/value heads (G = H // Hkv), N queries, S keys, D
query/key head width, Dv value head width.

A backward run with ``create_graph=True`` runs with grad mode on; that is how the kernels know
that their gradient will itself be differentiated (a gradient penalty, a Hessian-vector
product, MAML). They then hand the call to `attention_grads`: the same gradient as their
blocked backward (FlashAttention-2, Dao 2023, Algorithm 2, D_i = rowsum(dO_i * O_i)), written
once over the whole (B, H, N, S) probabilities in differentiable PyTorch ops, so autograd can
differentiate it again, to any order. Same mask, bias, bottom-right causal limit, scale, GQA
and the same dropout entries (the kernels' hash bits, `_dropout`). That path holds O(B·H·N·S)
memory, as any second-order graph through attention does: it must keep the probabilities.
A first-order backward (grad mode off) never comes here.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnkit.functional._dropout import keep_words, row_ids
from attnkit.functional._reference import _allowed, _repeat_kv
from attnkit.functional._trace import tracing

__all__ = [
    "attention_grads",
    "dropout_multiplier",
    "exact_sdpa_second_order",
    "hook_fused_node",
    "kernel_grads",
]


def dropout_multiplier(
    seed: Tensor, t_keep: int, inv_keep: float, shape: tuple[int, int, int, int], dtype
) -> Tensor:
    """The kernels' dropout as a (B, H, N, S) factor: inv_keep where the entry is kept (its
    32-bit word < t_keep), 0 where dropped; the bits of `_dropout.block_keep` for rows 0:N."""
    b, h, n, s = shape
    words = keep_words(seed, row_ids(b, h, n, 0, n, seed.device), 0, s)  # (B·H·N, S)
    return (words < t_keep).to(dtype).mul_(inv_keep).view(b, h, n, s)


def kernel_grads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor | None,
    dlse: Tensor | None,
    mask: Tensor | None,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    t_keep: int,
    inv_keep: float,
    seed: Tensor | None,
    want_dbias: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """`attention_grads` of a chunked-kernel call, whose dropout is (t_keep, inv_keep, seed)
    as in `attnkit.functional._dropout` (seed None: no dropout)."""
    work = torch.promote_types(q.dtype, torch.float32)
    shape = (*q.shape[:3], k.shape[2])  # (B, H, N, S)
    keep = None if seed is None else dropout_multiplier(seed, t_keep, inv_keep, shape, work)
    return attention_grads(
        q, k, v, dout, dlse, mask=mask, bias=bias, causal=causal, scale=scale, keep=keep,
        want_dbias=want_dbias,
    )  # fmt: skip


def attention_grads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor | None,
    dlse: Tensor | None,
    *,
    mask: Tensor | None,
    bias: Tensor | None,
    causal: bool,
    scale: float,
    keep: Tensor | None = None,
    want_dbias: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """dq, dk, dv (and dbias, if asked) of out = (softmax(S) * keep) v and lse = logsumexp(S),
    S = scale q kᵀ + bias with masked entries -inf, given dout (B, H, N, Dv) and dlse (B, H, N)
    (either may be None: no gradient on that output). Differentiable in q, k, v, bias, dout and
    dlse. Computed in float32 (float64 for float64 input); returned in that dtype.

    mask: boolean, True = may attend, broadcastable to (B, H, N, S); causal: bottom-right.
    keep: the (B, H, N, S) dropout factor of `dropout_multiplier`, or None.
    A row that sees no key has P = 0, so its gradients are 0 (never NaN).
    """
    work = torch.promote_types(q.dtype, torch.float32)
    h, hkv, n, s = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    qw = q.to(work)
    kw = _repeat_kv(k, h).to(work)  # (B, H, S, D)
    vw = _repeat_kv(v, h).to(work)  # (B, H, S, Dv)
    scores = torch.matmul(qw, kw.transpose(-2, -1)) * scale  # (B, H, N, S)
    if bias is not None:
        scores = scores + bias.to(work)
    allowed = _allowed(mask, causal, n, s, q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    with torch.no_grad():  # rows that see nothing; a softmax over all -inf would give NaN
        dead = torch.isneginf(scores.amax(-1, keepdim=True))  # (B, H, N, 1)
    p = torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)  # (B, H, N, S)
    if dout is None:  # only lse was used
        dout = p.new_zeros(*p.shape[:3], v.shape[-1])
    do = dout.to(work)  # (B, H, N, Dv)
    pk = p if keep is None else p * keep  # the probabilities that reached v
    dv = torch.matmul(pk.transpose(-2, -1), do)  # (B, H, S, Dv)
    dp = torch.matmul(do, vw.transpose(-2, -1))  # (B, H, N, S)
    if keep is not None:
        dp = dp * keep
    # softmax backward: dS = P (dP - rowsum(P dP)); lse adds P dlse (d lse / dS = P)
    row = (p * dp).sum(-1, keepdim=True)  # (B, H, N, 1)
    if dlse is not None:
        row = row - dlse.to(work).unsqueeze(-1)
    ds = p * (dp - row)  # (B, H, N, S)
    dq = torch.matmul(ds, kw) * scale  # (B, H, N, D)
    dk = torch.matmul(ds.transpose(-2, -1), qw) * scale  # (B, H, S, D)
    if hkv != h:  # the G query heads of one kv head add up: (B, H, S, X) -> (B, Hkv, S, X)
        dk = dk.unflatten(1, (hkv, h // hkv)).sum(2)
        dv = dv.unflatten(1, (hkv, h // hkv)).sum(2)
    dbias = ds.sum_to_size(bias.shape) if want_dbias and bias is not None else None
    return dq, dk, dv, dbias


# --------------------------------------------------------------------------- SDPA
#
# SDPA's fused kernels (the CPU flash kernel; flash, memory-efficient and cuDNN on CUDA) have no
# derivative for their backward: torch raises "derivative ... is not implemented" in the second
# backward. The fused node gets a post-hook, one shared function: it runs after the node's own
# backward and, only when grad mode is on (create_graph), replaces the node's gradients by
# `attention_grads` of the inputs the node saved, which autograd can differentiate. Measured
# (B=1, H=8, N=16, D=64, float32, 1 thread, medians of paired runs): calls that record no graph
# (inference, the decode step) pay one attribute read, +0.1 µs of ~20-25 µs; calls that do pay
# the hook, +3 µs forward and +8 µs forward+backward (+9 % of 92 µs; +5 % at N=64, within
# noise from N=256). An autograd.Function around SDPA would cost every grad-recording call more.
# SDPA's math path (dropout on the CPU, a bias that needs a gradient, Dv != D) is made of
# ordinary ops, differentiable twice already, and gets no hook.

_FUSED_NODE_PREFIX = "ScaledDotProduct"
# Nodes whose saved inputs the hook reads: the CPU one is tested; the CUDA ones save the same
# query/key/value/scale/is_causal/dropout_p (+ attn_bias). Any other fused node refuses.
_KNOWN_NODES = frozenset(
    f"ScaledDotProduct{kind}Backward0"
    for kind in ("FlashAttentionForCpu", "FlashAttention", "EfficientAttention", "CudnnAttention")
)

_REFUSAL = (
    "attnkit.attention: a second-order gradient (create_graph=True) cannot go through torch's "
    "SDPA here (backend='fused', which backend='auto' takes for this call): {why}. Use "
    "backend='chunked' or backend='reference' for this call; both give exact higher-order "
    "gradients with masks, bias, causal, GQA and dropout."
)


def exact_sdpa_second_order(out: Tensor) -> Tensor:
    """Make higher-order gradients through SDPA's output `out` exact (or a clear refusal).

    For attnkit's own SDPA calls, which pass is_causal only with N == S (where top-left and
    attnkit's bottom-right alignment agree). Returns `out`. Costs one attribute read when no
    graph is recorded; skipped under tracing (compiled graphs have no double backward).
    """
    if out.requires_grad and not tracing():
        hook_fused_node(out)
    return out


def hook_fused_node(out: Tensor) -> None:
    """`exact_sdpa_second_order` for an eager SDPA output that requires grad."""
    node = out.grad_fn
    if node is not None and node.name().startswith(_FUSED_NODE_PREFIX):
        node.register_hook(_sdpa_hook)
    # else a leaf, or SDPA's math path: ordinary ops, differentiable twice already


def _sdpa_hook(grad_inputs: tuple, grad_outputs: tuple) -> tuple | None:
    if not torch.is_grad_enabled():
        return None  # a first-order backward: SDPA's own gradients stand
    # The node being run (torch >= 2.1); its saved inputs are released after its post-hooks.
    node = getattr(torch._C, "_current_autograd_node", lambda: None)()
    saved = {
        name: getattr(node, f"_saved_{name}", None)
        for name in ("query", "key", "value", "attn_mask", "attn_bias", "dropout_p",
                     "is_causal", "scale")
    }  # fmt: skip
    q, k, v = saved["query"], saved["key"], saved["value"]
    why = None
    # grad_inputs: q, k, v (and the additive bias of the CUDA kernels, which must need none)
    if node is None or node.name() not in _KNOWN_NODES or q is None or len(grad_inputs) > 4:
        why = f"attnkit cannot read the inputs of {type(node).__name__}"
    elif len(grad_inputs) == 4 and grad_inputs[3] is not None:
        why = "SDPA's mask needs a gradient"
    elif saved["dropout_p"]:
        why = "SDPA drew its dropout inside its fused kernel; those entries cannot be replayed"
    elif saved["is_causal"] and q.shape[-2] != k.shape[-2]:
        why = "SDPA's is_causal is aligned top-left"
    if why is not None:
        raise NotImplementedError(_REFUSAL.format(why=why))
    mask = saved["attn_mask"] if saved["attn_mask"] is not None else saved["attn_bias"]
    is_bool = mask is not None and mask.dtype == torch.bool
    scale = 1.0 / math.sqrt(q.shape[-1]) if saved["scale"] is None else saved["scale"]  # SDPA's
    dq, dk, dv, _ = attention_grads(
        q, k, v, grad_outputs[0], None, mask=mask if is_bool else None,
        bias=None if is_bool else mask, causal=bool(saved["is_causal"]), scale=scale,
    )  # fmt: skip
    # None where the engine wants no gradient (an input not asked for): it must stay None
    exact = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None)
    return tuple(None if g is None else e for g, e in zip(grad_inputs, exact, strict=False))
