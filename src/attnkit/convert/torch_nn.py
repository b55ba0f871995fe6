"""`torch.nn.MultiheadAttention` <-> `attnkit.MultiHeadAttention`.

| torch.nn.MultiheadAttention            | attnkit.MultiHeadAttention                      |
| -------------------------------------- | ----------------------------------------------- |
| in_proj_weight (3E, E)                 | in_proj.qkv.weight (3E, E)           [FusedQKV] |
| in_proj_bias (3E,)                     | in_proj.qkv.bias (3E,)                          |
| q_proj_weight (E, E)                   | in_proj.q.weight                     [SplitQKV] |
| k_proj_weight, v_proj_weight (E, kdim) | in_proj.kv.weight (2E, kdim) (k rows, then v)   |
| in_proj_bias (3E,)                     | in_proj.q.bias (E,), in_proj.kv.bias (2E,)      |
| q_proj_weight (E, E)                   | in_proj.q.weight                  [SeparateQKV] |
| k_proj_weight (E, kdim)                | in_proj.k.weight (E, key_dim)                   |
| v_proj_weight (E, vdim)                | in_proj.v.weight (E, value_dim)                 |
| in_proj_bias (3E,)                     | in_proj.{q,k,v}.bias (E,) each                  |
| out_proj.weight (E, E), out_proj.bias  | proj.weight, proj.bias                          |

torch's module with `kdim == vdim == E` packs q, k, v in `in_proj_weight`;
otherwise it keeps three weights: `kdim == vdim` becomes attnkit's `SplitQKV`
(one context width), `kdim != vdim` its `SeparateQKV` (`key_dim`, `value_dim`).
Refused: `add_bias_kv` and `add_zero_attn` (from torch); GQA, an output width
or value head width of its own, no output projection (to torch).
Masks: torch's boolean masks mean True = *ignore*; convert them with
`attnkit.masks.from_torch_key_padding_mask` / `from_torch_attn_mask`.

Layout: attnkit modules read (B, N, C). A sequence-first torch module
(`batch_first=False`, torch's default) reads (N, B, C): converted as it is, it
would compute something else on the same tensors, so every `*_from_torch` refuses
it unless told `batch_first=True` (an acknowledgement that the attnkit module is
batch first); the ValueError says so and names the alternatives.
A torch state dict loads into an existing attnkit module through
`load_torch_mha_state` (`MultiHeadAttention.load_state_dict` refuses torch's names).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from attnkit.convert._state import check_state
from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.projection import FusedQKV, SeparateQKV, SplitQKV


def check_batch_first(what: str, torch_batch_first: bool, batch_first: bool | None) -> None:
    """Refuse to turn a sequence-first torch module into a batch-first attnkit one silently.

    `what` names the torch module; `batch_first=True` is the caller's acknowledgement
    that the attnkit module reads (B, N, C) while the torch one read (N, B, C).
    """
    drop_in = (
        "keep torch's layout with attnkit.nn.MultiheadAttention (the drop-in: "
        "drop_in.load_state_dict(m.state_dict()) takes the weights unchanged)"
        if what == "nn.MultiheadAttention"
        else "rebuild the torch module with batch_first=True (its state dict loads unchanged)"
    )
    if batch_first is False:
        raise ValueError(
            f"from_torch: batch_first=False cannot be honoured: attnkit modules always read "
            f"(B, N, C). Pass batch_first=True (and transpose your (N, B, C) inputs), or "
            f"{drop_in}"
        )
    if not torch_batch_first and batch_first is not True:
        raise ValueError(
            f"from_torch: this {what} has batch_first=False: it reads (N, B, C), sequence "
            f"first, while the attnkit module reads (B, N, C) and would compute something "
            f"else on the same tensors. Either pass batch_first=True to convert it anyway "
            f"and give the result x.transpose(0, 1), or {drop_in}"
        )


@torch.no_grad()
def mha_from_torch(
    m: nn.MultiheadAttention, *, batch_first: bool | None = None
) -> MultiHeadAttention:
    """An attnkit module with exactly the weights of `m` (copied, same dtype/device).

    attnkit modules are always batch first, (B, N, C). A sequence-first `m`
    (batch_first=False, torch's default) is refused with a ValueError naming
    `batch_first`, unless `batch_first=True` says you will give the result (B, N, C)
    inputs; its layout is then remembered, so `mha_to_torch` hands back a
    sequence-first module that reads its inputs as `m` did.
    """
    if not isinstance(m, nn.MultiheadAttention):
        raise ValueError(f"expected torch.nn.MultiheadAttention, got {type(m).__name__}")
    check_batch_first("nn.MultiheadAttention", m.batch_first, batch_first)
    if m.bias_k is not None or m.add_zero_attn:
        raise ValueError("from_torch: add_bias_kv / add_zero_attn have no attnkit equivalent")
    e, bias = m.embed_dim, m.in_proj_bias is not None
    ours = MultiHeadAttention(
        e, m.num_heads, key_dim=m.kdim, value_dim=m.vdim, qkv_bias=bias, out_bias=bias,
        dropout=m.dropout,
    ).to(device=m.out_proj.weight.device, dtype=m.out_proj.weight.dtype)  # fmt: skip
    new = {"proj.weight": m.out_proj.weight}
    if bias:
        new["proj.bias"] = m.out_proj.bias
    names = _PACKED[type(ours.in_proj)]
    if m._qkv_same_embed_dim:
        weights = m.in_proj_weight.split(e)  # (E, E) each: q, k, v rows
    else:
        weights = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
    for name, parts in names.items():
        new[f"in_proj.{name}.weight"] = torch.cat([weights[i] for i in parts])
        if bias:
            new[f"in_proj.{name}.bias"] = torch.cat([m.in_proj_bias.split(e)[i] for i in parts])
    ours.load_state_dict(new, strict=True)
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
    if not isinstance(ours.proj, nn.Linear):
        problems.append("no output projection (out_proj=False; torch always has one)")
    elif ours.out_dim != e:
        problems.append(f"out_dim={ours.out_dim} != dim={e}")
    if ours.v_head_dim != ours.head_dim:
        problems.append(f"v_head_dim={ours.v_head_dim} != head_dim={ours.head_dim}")
    sd = ours.state_dict()
    bias = "proj.bias" in sd
    if any(k.startswith("in_proj.") and k.endswith(".bias") for k in sd) != bias:
        problems.append("qkv_bias != out_bias (torch has one bias flag)")
    if ours.rotary is not None:
        problems.append("rotary positions (RoPE: torch has no such option)")
    if ours.attend.scale is not None and ours.attend.scale != ours.head_dim**-0.5:
        problems.append(f"scale={ours.attend.scale} is not 1/sqrt(head_dim)")
    if problems:
        raise ValueError(
            "to_torch: torch.nn.MultiheadAttention cannot express " + "; ".join(problems)
        )
    w = sd["proj.weight"]
    m = nn.MultiheadAttention(
        e, h, dropout=ours.attend.dropout, bias=bias, kdim=ours.in_proj.key_dim,
        vdim=ours.in_proj.value_dim, batch_first=batch_first,
    ).to(device=w.device, dtype=w.dtype)  # fmt: skip
    # torch's q, k, v weights (E, E|kdim|vdim) and biases (E,), in that order
    weights, biases = _unpack(sd, "weight", ours.in_proj, e), _unpack(sd, "bias", ours.in_proj, e)
    if m._qkv_same_embed_dim:
        m.in_proj_weight.copy_(torch.cat(weights))
    else:
        for target, t in zip(
            (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight), weights, strict=True
        ):
            target.copy_(t)
    m.out_proj.weight.copy_(w)
    if bias:
        m.in_proj_bias.copy_(torch.cat(biases))
        m.out_proj.bias.copy_(sd["proj.bias"])
    return m


def load_torch_mha_state(
    ours: MultiHeadAttention, state: Mapping[str, Tensor]
) -> MultiHeadAttention:
    """Copy a `torch.nn.MultiheadAttention` state dict (torch's names: `in_proj_weight`,
    `in_proj_bias`, `out_proj.weight`, ...) into `ours`, exactly; returns `ours`.

    The state must be that of the torch module `mha_to_torch(ours)` builds (same widths,
    `kdim`/`vdim`, biases): ValueError naming each missing, unexpected or mis-shaped key,
    with torch's names. A state dict carries no head count: `ours.num_heads` must be the
    torch module's (`mha_from_torch(m)` reads it from the module itself).
    """
    source = "load_torch_mha_state"
    try:
        twin = mha_to_torch(ours, batch_first=True)  # torch's names and shapes for `ours`
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    check_state(state, {k: tuple(v.shape) for k, v in twin.state_dict().items()}, source=source)
    twin.load_state_dict(state, strict=True)
    ours.load_state_dict(mha_from_torch(twin).state_dict(), strict=True)
    return ours


# attnkit's packed projections: which of torch's q, k, v (0, 1, 2) each one holds, in row order
_PACKED = {
    FusedQKV: {"qkv": (0, 1, 2)},
    SplitQKV: {"q": (0,), "kv": (1, 2)},
    SeparateQKV: {"q": (0,), "k": (1,), "v": (2,)},
}


def _unpack(sd: dict[str, Tensor], kind: str, in_proj: nn.Module, e: int) -> list[Tensor]:
    """torch's [q, k, v] `kind` ("weight" or "bias") from attnkit's packed projections."""
    out: dict[int, Tensor] = {}
    for name, parts in _PACKED[type(in_proj)].items():
        key = f"in_proj.{name}.{kind}"
        if key in sd:
            out.update(zip(parts, sd[key].split(e), strict=True))  # (E, ...) rows each
    return [out[i] for i in sorted(out)]
