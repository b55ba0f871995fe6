"""The cached one-token step of `GPT` without its module calls: what `generate` runs per token.

Dimensions: B batch, C model width, F feed-forward width, V vocabulary.

A decode step of a small GPT is a few matrix-vector products per layer and about fifteen
`nn.Module` calls per layer; at batch 1 the calls' Python cost is a tenth of the step, and it
is what made attnkit's GPT decode slower than a plain PyTorch GPT. `decode_step` runs the same
operations in the same order as the module path — `F.embedding`, `F.layer_norm`, `F.linear`,
the activation, `CachedMultiHeadAttention.decode_core` with its `KVCache.append` and
`attention_without_checks` — on the modules' own parameters, so its logits are bitwise equal
to the module path's (tested); at batch 1 the projections are `torch.addmv` instead of
`F.linear`, equal up to float rounding. `torch.nn.MultiheadAttention`'s inference fast path
is the precedent.

It is taken only where nothing can tell the difference: every module in eval mode; no forward
or backward hook on any module of the model and no global one; `Attend` not recording
(`record_attention`); and every submodule of exactly the type `GPT` builds. A replaced or
wrapped module (LoRA, a parametrization, pruning, a quantized Linear, another activation or
norm) makes `decode_step` return None, and the modules run as written.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.models.decoding import CachedMultiHeadAttention, KVCache, _plain, global_hooks
from attnkit.modules.blocks import FeedForward, PreNormResidual
from attnkit.modules.embed import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from attnkit.modules.projection import FusedQKV

__all__ = ["decode_step"]

# nn activation module -> the functional its forward calls
_ACTIVATIONS: dict[type, Callable[[nn.Module, Tensor], Tensor]] = {
    nn.GELU: lambda m, x: F.gelu(x, approximate=m.approximate),
    nn.ReLU: lambda m, x: F.relu(x),
    nn.SiLU: lambda m, x: F.silu(x),
}


def decode_step(
    gpt: nn.Module, ids: Tensor, cache: KVCache, *, block_type: type, tokens_type: type
) -> Tensor | None:
    """Logits (B, 1, V) of one new token per row, ids (B, 1), over `cache` (advanced by one);
    None when the module path must run instead (see the module docstring). `block_type` and
    `tokens_type` are the classes `GPT` builds its blocks and token table from (passed in:
    this module must not import `attnkit.models.gpt`, which imports it)."""
    plan = _recall(gpt, cache)
    if plan is None:
        plan = _plan(gpt, block_type, tokens_type)  # checks everything before the cache changes
        if plan is None:
            return None
        _keep(gpt, cache, plan)
    tokens, positions, layers, norm, head = plan
    offset = cache.length
    if positions is not None and offset >= positions.shape[0]:
        return None  # the module path raises its error about the position table
    x = F.embedding(ids, tokens)  # (B, 1, C)
    if positions is not None:
        x = x + positions[offset : offset + 1]
    linear = _gemv if ids.shape[0] == 1 else F.linear
    for ln1, mha, attend, widths, qkv, proj, ln2, fc1, act, fc2 in layers:
        o = mha.decode_core(linear(_layer_norm(ln1, x), *qkv), cache, attend, widths, True)
        x = x + linear(o, *proj)  # (B, 1, C)
        h = _ACTIVATIONS[type(act)](act, linear(_layer_norm(ln2, x), *fc1))  # (B, 1, F)
        x = x + linear(h, *fc2)
    cache.length += 1
    return linear(_layer_norm(norm, x), *head)  # (B, 1, V)


def _gemv(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """F.linear for one row x (1, 1, In) -> (1, 1, Out) as a matrix-vector product: BLAS's gemv
    streams the weight once, a few % faster than the one-row matrix product F.linear runs
    (AMD EPYC, 1 thread, the weights of a decode step: 4-7 %), equal up to float rounding."""
    v = x.view(-1)  # (In,)
    out = torch.mv(weight, v) if bias is None else torch.addmv(bias, weight, v)  # (Out,)
    return out.view(1, 1, -1)


def _layer_norm(norm: tuple, x: Tensor) -> Tensor:
    return F.layer_norm(x, *norm)


def _recall(gpt: nn.Module, cache: KVCache) -> tuple | None:
    """The plan kept at this generation loop's first step (see `_keep`), or None."""
    if cache.loop_model is not gpt:
        return None
    return cache.memo.get(_MEMO)


def _keep(gpt: nn.Module, cache: KVCache, plan: tuple) -> None:
    """Keep the plan for the next steps when only `generate` runs between them: it calls this
    GPT itself (`loop_model`) and the GPT has no hook (a hook would be code run between steps,
    free to change the model; a global hook already made `_plan` refuse)."""
    if cache.loop_model is gpt and not (gpt._forward_hooks or gpt._forward_pre_hooks):
        cache.memo[_MEMO] = plan


_MEMO = "attnkit.models.gpt_step"


def _plan(gpt: nn.Module, block_type: type, tokens_type: type) -> tuple | None:
    """What `decode_step` reads, or None unless the model runs as built: eval mode, no hooks,
    every module of the type GPT builds. Read through `_modules` / `_parameters` (a plain
    attribute read of a submodule costs ~1-2 µs: `nn.Module.__getattr__` runs after a failed
    lookup), about 30 µs for 4 layers: once per `generate` loop (kept, see `_keep`), at every
    step of a cache used by hand."""
    if gpt.training or global_hooks():
        return None
    mods = gpt._modules
    tokens, positions = mods["tokens"], mods.get("positions")  # None: not a module (rotary)
    if not (
        _plain_module(tokens, tokens_type)
        and tokens.max_norm is None
        and _plain_module(mods["blocks"], nn.ModuleList)
    ):
        return None
    pos = _position_table(positions, tokens._parameters["weight"].dtype)
    if positions is not None and pos is None:
        return None
    norm, head = _norm(mods["norm"]), _linear(mods["head"])
    if norm is None or head is None:
        return None
    layers = []
    for block in mods["blocks"]._modules.values():
        layer = _layer(block, block_type)
        if layer is None:
            return None
        layers.append(layer)
    return tokens._parameters["weight"], pos, layers, norm, head


def _position_table(positions: nn.Module | None, dtype: torch.dtype) -> Tensor | None:
    """The (context, C) table a plain learned or sinusoidal position module adds, or None.
    A sinusoidal table is used only in the tokens' dtype (its module casts it to x's dtype)."""
    if _plain_module(positions, LearnedPositionalEmbedding):
        return positions._parameters["weight"]
    if _plain_module(positions, SinusoidalPositionalEncoding):
        table = positions._buffers["table"]
        return table if table.dtype == dtype else None
    return None


def _layer(block: nn.Module, block_type: type) -> tuple | None:
    """One GPTBlock's (ln1, attention, attend, widths, qkv, proj, ln2, fc1, act, fc2), or None."""
    if not _plain_module(block, block_type):
        return None
    attn, ff = block._modules["attn"], block._modules["ff"]
    if not (_plain_module(attn, PreNormResidual) and _plain_module(ff, PreNormResidual)):
        return None
    mha, ffn = attn._modules["fn"], ff._modules["fn"]
    if not (_plain_module(mha, CachedMultiHeadAttention) and _plain_module(ffn, FeedForward)):
        return None
    in_proj, attend, act = mha._modules["in_proj"], mha._modules["attend"], ffn._modules["act"]
    if not (
        _plain_module(in_proj, FusedQKV)
        and _plain(attend)
        and type(act) in _ACTIVATIONS
        and _plain_module(act, type(act))
    ):
        return None
    parts = (
        _norm(attn._modules["norm"]),
        _linear(in_proj._modules["qkv"]),
        _linear(mha._modules["proj"]),
        _norm(ff._modules["norm"]),
        _linear(ffn._modules["fc1"]),
        _linear(ffn._modules["fc2"]),
    )
    if any(p is None for p in parts):
        return None
    ln1, qkv, proj, ln2, fc1, fc2 = parts
    widths = (in_proj.q_width, in_proj.k_width, in_proj.v_width)
    return ln1, mha, attend, widths, qkv, proj, ln2, fc1, act, fc2


def _norm(m: nn.Module) -> tuple | None:
    """A plain LayerNorm's F.layer_norm arguments after x, or None."""
    if not _plain_module(m, nn.LayerNorm):
        return None
    p = m._parameters
    return m.normalized_shape, p["weight"], p["bias"], m.eps


def _linear(m: nn.Module) -> tuple | None:
    """A plain Linear's (weight, bias), or None."""
    if not _plain_module(m, nn.Linear):
        return None
    p = m._parameters
    return p["weight"], p["bias"]


def _plain_module(m: nn.Module, cls: type) -> bool:
    """m is exactly a `cls` (not a subclass: parametrize and friends subclass), in eval mode
    (a submodule put back in training mode would apply its dropout), with no hook."""
    return type(m) is cls and not (
        m.training
        or m._forward_hooks
        or m._forward_pre_hooks
        or m._backward_hooks
        or m._backward_pre_hooks
    )
