"""`torch.nn.MultiheadAttention` <-> `attnkit.MultiHeadAttention`.

| torch.nn.MultiheadAttention            | attnkit.MultiHeadAttention              |
| -------------------------------------- | --------------------------------------- |
| in_proj_weight (3E, E)                 | in_proj.qkv.weight (3E, E)  [FusedQKV]  |
| in_proj_bias (3E,)                     | in_proj.qkv.bias (3E,)                  |
| q_proj_weight (E, E)                   | in_proj.q.weight            [SplitQKV]  |
| k_proj_weight, v_proj_weight (E, kdim) | in_proj.kv.weight (2E, kdim) (k rows, then v) |
| out_proj.weight (E, E), out_proj.bias  | proj.weight, proj.bias                  |

torch's module with `kdim == vdim == E` packs q, k, v in `in_proj_weight`;
otherwise it keeps three weights. attnkit takes one context for keys and values,
so `kdim != vdim` is refused, as are `add_bias_kv` and `add_zero_attn`.
Masks: torch's boolean masks mean True = *ignore*; convert them with
`attnkit.masks.from_torch_key_padding_mask` / `from_torch_attn_mask`.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.projection import FusedQKV


@torch.no_grad()
def mha_from_torch(m: nn.MultiheadAttention) -> MultiHeadAttention:
    """An attnkit module with exactly the weights of `m` (copied, same dtype/device).

    attnkit modules are always batch first, (B, N, C). A sequence-first `m`
    (batch_first=False) is converted all the same and its layout is remembered, so
    `mha_to_torch` hands back a sequence-first module that reads its inputs as `m` did.
    """
    if not isinstance(m, nn.MultiheadAttention):
        raise ValueError(f"expected torch.nn.MultiheadAttention, got {type(m).__name__}")
    if m.bias_k is not None or m.add_zero_attn:
        raise ValueError("from_torch: add_bias_kv / add_zero_attn have no attnkit equivalent")
    if m.kdim != m.vdim:
        raise ValueError(
            f"from_torch: kdim={m.kdim} != vdim={m.vdim}; attnkit projects keys and values "
            "from one context"
        )
    e, bias = m.embed_dim, m.in_proj_bias is not None
    ours = MultiHeadAttention(
        e, m.num_heads, context_dim=m.kdim, qkv_bias=bias, out_bias=bias, dropout=m.dropout
    ).to(device=m.out_proj.weight.device, dtype=m.out_proj.weight.dtype)
    if m._qkv_same_embed_dim:
        ours.in_proj.qkv.weight.copy_(m.in_proj_weight)
    else:
        ours.in_proj.q.weight.copy_(m.q_proj_weight)
        ours.in_proj.kv.weight.copy_(torch.cat([m.k_proj_weight, m.v_proj_weight]))
    if bias:
        target = ours.in_proj.qkv if m._qkv_same_embed_dim else None
        if target is not None:
            target.bias.copy_(m.in_proj_bias)
        else:
            ours.in_proj.q.bias.copy_(m.in_proj_bias[:e])
            ours.in_proj.kv.bias.copy_(m.in_proj_bias[e:])
        ours.proj.bias.copy_(m.out_proj.bias)
    ours.proj.weight.copy_(m.out_proj.weight)
    # read by mha_to_torch only; the module itself never looks at it
    ours._torch_batch_first = bool(m.batch_first)
    return ours


@torch.no_grad()
def mha_to_torch(
    ours: MultiHeadAttention, *, batch_first: bool | None = None
) -> nn.MultiheadAttention:
    """A `torch.nn.MultiheadAttention` with exactly our weights.

    `batch_first` defaults to the layout of the module `ours` was converted from by
    `mha_from_torch` (so a round trip keeps a sequence-first module sequence-first),
    and to True for a module built in attnkit.
    """
    if batch_first is None:
        batch_first = getattr(ours, "_torch_batch_first", True)
    e, h = ours.dim, ours.num_heads
    problems = []
    if e is None:
        problems.append("dim is lazy (call the module once first)")
    if ours.num_kv_heads != h:
        problems.append(f"num_kv_heads={ours.num_kv_heads} != num_heads={h} (GQA)")
    if e is not None and ours.head_dim * h != e:
        problems.append(f"head_dim·heads={ours.head_dim * h} != dim={e}")
    if ours.out_dim != e:
        problems.append(f"out_dim={ours.out_dim} != dim={e}")
    bias = ours.proj.bias is not None
    in_bias = (ours.in_proj.qkv if isinstance(ours.in_proj, FusedQKV) else ours.in_proj.q).bias
    if (in_bias is not None) != bias:
        problems.append("qkv_bias != out_bias (torch has one bias flag)")
    if ours.attend.scale is not None and ours.attend.scale != ours.head_dim**-0.5:
        problems.append(f"scale={ours.attend.scale} is not 1/sqrt(head_dim)")
    if problems:
        raise ValueError(
            "to_torch: torch.nn.MultiheadAttention cannot express " + "; ".join(problems)
        )
    kdim = ours.in_proj.context_dim
    w = ours.proj.weight
    m = nn.MultiheadAttention(
        e, h, dropout=ours.attend.dropout, bias=bias, kdim=kdim, vdim=kdim, batch_first=batch_first
    ).to(device=w.device, dtype=w.dtype)
    if m._qkv_same_embed_dim:
        m.in_proj_weight.copy_(ours.in_proj.qkv.weight)
        if bias:
            m.in_proj_bias.copy_(ours.in_proj.qkv.bias)
    else:
        m.q_proj_weight.copy_(ours.in_proj.q.weight)
        m.k_proj_weight.copy_(ours.in_proj.kv.weight[:e])
        m.v_proj_weight.copy_(ours.in_proj.kv.weight[e:])
        if bias:
            m.in_proj_bias.copy_(torch.cat([ours.in_proj.q.bias, ours.in_proj.kv.bias]))
    m.out_proj.weight.copy_(w)
    if bias:
        m.out_proj.bias.copy_(ours.proj.bias)
    return m
