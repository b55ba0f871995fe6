"""Multi-head attention as a module: project, split heads, attend, merge, project.

Dimensions: B batch, N query length, S key/value length, C query width, Ck key
width, Cv value width (Cc when one context gives both), H heads, Hkv key/value
heads, Dk query/key head width, Dv value head width, Co output width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from attnkit.functional.attention import AttentionOutput, attention
from attnkit.modules._checks import positive_int, probability
from attnkit.modules._mha_checks import check_inputs, kv_dims, resolve_head_dim
from attnkit.modules._recording import sinks as recording_sinks
from attnkit.modules.projection import FusedQKV, SeparateQKV, SplitQKV

if TYPE_CHECKING:
    from attnkit.functional.score_mods import ScoreFn

__all__ = ["Attend", "MultiHeadAttention"]


class Attend(nn.Module):
    """The named point where attention probabilities pass.

    Wraps `attnkit.attention`. A call that a `record_attention` block open in the calling
    thread covers takes the path that returns the probabilities and hands them to the
    recording (`attnkit.modules._recording`). Nothing is stored on the module.
    """

    def __init__(self, *, scale: float | None = None, dropout: float = 0.0, backend: str = "auto"):
        super().__init__()
        self.scale, self.dropout, self.backend = scale, probability("dropout", dropout), backend
        # True: every call returns the weights (reference backend); recording does not need it
        self.need_weights = False

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        causal: bool = False,
        score_mod: ScoreFn | None = None,
    ) -> AttentionOutput:
        """q (B, H, N, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) -> AttentionOutput.
        `score_mod`: as in `attnkit.attention` (`attnkit.score_mods`)."""
        sinks = recording_sinks(self)
        need_weights = self.need_weights or bool(sinks)
        res = attention(
            q,
            k,
            v,
            mask=mask,
            bias=bias,
            causal=causal,
            scale=self.scale,
            dropout_p=self.dropout,
            training=self.training,
            need_weights=need_weights,
            backend="reference" if need_weights else self.backend,
            score_mod=score_mod,
        )
        for sink in sinks:
            sink(res.weights)  # (B, H, N, S)
        return res

    def extra_repr(self) -> str:
        return f"scale={self.scale}, dropout={self.dropout}, backend={self.backend!r}"


class MultiHeadAttention(nn.Module):
    """Multi-head self- or cross-attention, batch first.

    Shapes: query (B, N, C); key (B, S, Ck); value (B, S, Cv); output (B, N, Co).
    Queries and keys meet in heads of width Dk (`head_dim`), values are carried
    in heads of width Dv (`v_head_dim`): Vaswani et al. 2017, §3.2.2 allow
    d_v != d_k, and keys and values may come from different tensors.

    Args:
        dim: query width C (None: inferred on first call, like LazyLinear).
        num_heads: H.
        out_dim: output width Co (default C). T2T-ViT maps width 49 to 64.
        context_dim: width Cc of one context that gives both keys and values
            (shorthand for key_dim = value_dim = Cc; default C). When it
            differs from C the module is cross-attention only.
        key_dim: width Ck of the key input (default `context_dim`, else C);
            torch's `kdim`. Not Keras' `key_dim`, which is our `head_dim`.
        value_dim: width Cv of the value input (default Ck); torch's `vdim`.
            Ck != Cv needs key and value passed apart.
        num_kv_heads: Hkv < H gives grouped-query (Hkv > 1) or multi-query
            (Hkv = 1) attention: fewer key/value projections.
        head_dim: Dk, head width of queries and keys (default C // H, or
            Co // H when dim is None).
        v_head_dim: Dv, head width of values (default Dk); Keras' `value_dim`.
        out_proj: False builds no output projection W_O: the output is the
            merged heads, width Co = H·Dv (out_dim, if given, must equal it).
        qkv_bias, out_bias: biases of the input and output projections.
        scale: scores multiplier (default 1/sqrt(Dk)).
        dropout: dropout on the attention probabilities while training.
        backend: the `attnkit.attention` backend ("auto" by default).
        rotary: a `attnkit.modules.RotaryEmbedding` (RoPE) applied to q and k
            after the projection, before attention (self-attention only).
        device, dtype: of the parameters, as for `torch.nn.Linear`.

    Sizes must be positive integers; a bad one raises ValueError naming it.
    Parameters: `in_proj` (`FusedQKV`, `SplitQKV`, or `SeparateQKV` when
    Ck != Cv), `proj` (H·Dv -> Co; `nn.Identity` without an output projection).
    """

    def __init__(
        self,
        dim: int | None,
        num_heads: int,
        *,
        out_dim: int | None = None,
        context_dim: int | None = None,
        key_dim: int | None = None,
        value_dim: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        v_head_dim: int | None = None,
        out_proj: bool = True,
        qkv_bias: bool = True,
        out_bias: bool = True,
        scale: float | None = None,
        dropout: float = 0.0,
        backend: str = "auto",
        rotary: nn.Module | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        dim = positive_int("dim", dim, optional=True)
        out_dim = positive_int("out_dim", out_dim, optional=True)
        key_dim, value_dim = kv_dims(dim, context_dim, key_dim, value_dim)
        num_heads = positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = resolve_head_dim(dim, num_heads, num_kv_heads, head_dim, out_dim)
        self.v_head_dim = positive_int("v_head_dim", v_head_dim, optional=True) or self.head_dim
        self.dim, self.key_dim, self.value_dim = dim, key_dim, value_dim
        q_width, k_width = num_heads * self.head_dim, num_kv_heads * self.head_dim
        v_width = num_kv_heads * self.v_head_dim
        if key_dim == value_dim == dim:  # also dim = None (lazy) with no key/value widths
            self.in_proj: FusedQKV | SplitQKV | SeparateQKV = FusedQKV(
                dim, q_width, k_width, qkv_bias, v_width=v_width, **fk
            )
        elif key_dim == value_dim:
            self.in_proj = SplitQKV(dim, key_dim, q_width, k_width, qkv_bias, v_width=v_width, **fk)
        else:
            self.in_proj = SeparateQKV(
                dim, key_dim, value_dim, q_width, k_width, v_width, qkv_bias, **fk
            )
        self.attend = Attend(scale=scale, dropout=dropout, backend=backend)
        merged = num_heads * self.v_head_dim  # H·Dv
        if out_proj:
            self.out_dim = dim if out_dim is None else out_dim
            if self.out_dim is None:
                raise ValueError("dim=None (lazy) needs out_dim to size the output projection")
            self.proj: nn.Linear | nn.Identity = nn.Linear(merged, self.out_dim, out_bias, **fk)
        else:
            if out_dim is not None and out_dim != merged:
                raise ValueError(
                    f"out_dim={out_dim} must equal num_heads·v_head_dim={merged} without an "
                    "output projection (out_proj=False); leave out_dim unset"
                )
            self.out_dim, self.proj = merged, nn.Identity()
        if rotary is not None and getattr(rotary, "dim", 0) > self.head_dim:
            raise ValueError(f"rotary.dim={rotary.dim} exceeds head_dim={self.head_dim}")
        self.rotary = rotary

    def heads_qkv(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        pos: Tensor | None = None,
        context_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Project and split heads: q (B, H, N, Dk), k (B, Hkv, S, Dk), v (B, Hkv, S, Dv)."""
        check_inputs(self, query, key, value, pos, context_pos)
        q, k, v = self.in_proj(query, key, value, pos, context_pos)
        q = q.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)  # (B, H, N, Dk)
        k = k.unflatten(-1, (self.num_kv_heads, -1)).transpose(1, 2)  # (B, Hkv, S, Dk)
        v = v.unflatten(-1, (self.num_kv_heads, -1)).transpose(1, 2)  # (B, Hkv, S, Dv)
        return q, k, v

    def rotate(
        self,
        q: Tensor,
        k: Tensor,
        context: Tensor | None = None,
        offset: int = 0,
        *,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Apply `rotary` (if any) to q (B, H, N, Dk) and k (B, Hkv, N, Dk) at positions
        offset.., or at `position_ids` (N,) or (B, N) (which need a `rotary`)."""
        if self.rotary is None:
            if position_ids is not None:
                raise ValueError(
                    "position_ids are the positions `rotary` rotates q and k by, and this "
                    "attention has no rotary: add positions to its input instead"
                )
            return q, k
        if context is not None:
            raise ValueError("rotary positions are for self-attention: got a context")
        if position_ids is None:
            return self.rotary(q, k, offset=offset)
        return self.rotary(q, k, position_ids=position_ids)

    @staticmethod
    def merge_heads(o: Tensor) -> Tensor:
        """(B, H, N, Dv) -> (B, N, H·Dv)."""
        return o.transpose(1, 2).flatten(2)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        causal: bool = False,
        pos: Tensor | None = None,
        context_pos: Tensor | None = None,
        position_ids: Tensor | None = None,
        score_mod: ScoreFn | None = None,
    ) -> Tensor:
        """query (B, N, C), key (B, S, Ck), value (B, S, Cv) -> (B, N, Co).

        key None: self-attention (keys and values from `query`). value None:
        values from `key`. `context` (B, S, Cc) is the one-tensor spelling,
        key = value = context (pass it or key/value, not both).
        mask: boolean, True = may attend, broadcastable to (B, H, N, S) — a
            key-padding mask is (B, 1, 1, S) (see `attnkit.masks.padding`).
        bias: additive scores broadcastable to (B, H, N, S).
        causal: query i sees keys j <= i + S - N (bottom-right aligned).
        pos, context_pos: positions (B, N, C) / (B, S, Ck) added to the query
            and key inputs only, not to the values (DETR style). In
            self-attention `pos` is added to both q and k inputs.
        position_ids: integer positions (N,) or (B, N) of the tokens, by which `rotary`
            rotates q and k (self-attention with a rotary only; default 0 .. N-1). A packed
            batch passes positions that restart at each document
            (`attnkit.masks.document_positions`) with ``mask=masks.document(ids)``.
        score_mod: a score function (`attnkit.score_mods`; e.g. ``AlibiBias.score_mod(n, s)``,
            ``RelativePositionBias.score_mod(n, s)``), applied block by block before `bias`
            and the masks: O(N) memory where a dense `bias` is O(N·S).

        Queries whose mask row is all False get output `proj(0)` = the output
        bias (attention output 0), never NaN.
        """
        if context is not None:
            if key is not None or value is not None:
                raise ValueError("pass context= (key = value = context) or key/value, not both")
            key = context
        q, k, v = self.heads_qkv(query, key, value, pos=pos, context_pos=context_pos)
        q, k = self.rotate(q, k, key, position_ids=position_ids)
        o = self.attend(q, k, v, mask=mask, bias=bias, causal=causal, score_mod=score_mod).out
        return self.proj(self.merge_heads(o))  # o: (B, H, N, Dv)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # torch.nn.MultiheadAttention's names would only come out as missing and unexpected
        # keys (or, with strict=False, load nothing): say what they are and what to call.
        # Naming the converter here imports nothing from it (imports flow downward).
        found = [prefix + k for k in _TORCH_MHA_NAMES if prefix + k in state_dict]
        own = [prefix + k for k in self.state_dict()] if found else []
        if found and not all(k in state_dict for k in own):
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: {found} are "
                f"torch.nn.MultiheadAttention's parameter names; this module's are {own}. "
                "Load a torch state dict with attnkit.convert.load_torch_mha_state(module, "
                "state), convert a torch module with attnkit.convert.mha_from_torch(m) (it "
                "also reads the heads and widths), or keep torch's names with "
                "attnkit.nn.MultiheadAttention"
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        text = (
            f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, out_dim={self.out_dim}"
        )
        if self.key_dim != self.dim or self.value_dim != self.dim:
            text += f", key_dim={self.key_dim}, value_dim={self.value_dim}"
        if self.v_head_dim != self.head_dim:
            text += f", v_head_dim={self.v_head_dim}"
        return text if isinstance(self.proj, nn.Linear) else text + ", out_proj=False"


# the parameter names of torch.nn.MultiheadAttention (attnkit.convert.torch_nn maps them)
_TORCH_MHA_NAMES = (
    "in_proj_weight",
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
    "in_proj_bias",
    "bias_k",
    "bias_v",
    "out_proj.weight",
    "out_proj.bias",
)
