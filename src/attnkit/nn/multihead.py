"""`torch.nn.MultiheadAttention` with attnkit inside: the same module for torch's users, computed
by `attnkit.attention`.

Dimensions: B batch, L query length, S key length (S' = S plus the `bias_k` and zero-attention
columns), E embed_dim, H num_heads, D = E // H head width, kdim / vdim the key / value widths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.functional.attention import attention
from attnkit.nn._errors import TorchAssertionError, TorchRuntimeError
from attnkit.nn.functional import top_left_causal

__all__ = ["MultiheadAttention"]


class MultiheadAttention(nn.MultiheadAttention):
    """`torch.nn.MultiheadAttention`, computed by `attnkit.attention`.

    A subclass of torch's module that replaces only `forward`: the constructor, the
    parameters (`in_proj_weight`, or `q_proj_weight`/`k_proj_weight`/`v_proj_weight` when
    kdim or vdim differ from embed_dim; `in_proj_bias`, `out_proj`, `bias_k`/`bias_v`), their
    initialisation (the same seed gives the same weights), the state dict and every
    attribute are torch's. A checkpoint of either loads into the other unchanged, and
    `from attnkit.nn import MultiheadAttention` in place of torch's changes no other line.

    `forward` takes torch's arguments with torch's meaning and returns `(out, weights)`:

    * masks in **torch's polarity**: a boolean `key_padding_mask` (B, S) or `attn_mask`
      (L, S) / (B·H, L, S) means **True = not allowed**; a float one is added to the scores.
      (attnkit's own modules take True = may attend.)
    * `is_causal` is, as in torch, a hint that `attn_mask` is the causal mask: it needs
      `attn_mask`, and without `key_padding_mask` and `need_weights` the causal limit (top-left
      aligned, torch's) replaces `attn_mask`.
    * `need_weights=True` (torch's default) returns the probabilities, averaged over the heads
      (B, L, S') or per head (B, H, L, S') with `average_attn_weights=False`, computed on
      attnkit's reference backend; `need_weights=False` returns None and lets `auto` pick the
      fastest backend (with dropout, the compiled kernel instead of SDPA's slow math path).
    * dropout acts only in training. The weights returned in training are the probabilities
      before dropout (attnkit's rule; torch returns them after dropout).

    Differences from torch, on purpose: a query row that may attend to no key (every key
    masked) gets attention output 0 (the module's output is then `out_proj.bias`) and
    weights 0, with finite gradients, where torch returns NaN; dropout keeps each
    probability with torch's chance and scale but from attnkit's own random stream, so the
    same seed drops other positions than torch's. Bad input raises attnkit's message naming
    the argument, as an instance of ValueError and of the class torch raises there
    (`TorchAssertionError` for the shapes of the inputs and of key_padding_mask, a mask's
    dtype or rank and nested tensors; `TorchRuntimeError` for attn_mask's sizes, `is_causal`
    alone and the inputs' dtypes).
    Torch's inference fast path (eval, no grad, nested tensors) is not taken: every call
    goes through attnkit. Nested tensors are refused.

    `torch.jit.trace` records attnkit's computation. `torch.jit.script` cannot compile
    attnkit's backends: a scripted module (or a scripted model holding one) computes with
    torch's own `F.multi_head_attention_forward` and the same weights, so it gives torch's
    results, NaN rows and dropout stream included.
    """

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """query (L, B, E) — (B, L, E) with batch_first, (L, E) unbatched; key (S, B, kdim);
        value (S, B, vdim) -> (out of query's layout with width E, weights or None)."""
        args = (key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal)
        if torch.jit.is_scripting():  # TorchScript compiles this branch only
            return self._torch_forward(query, key, value, *args)
        return self._attnkit_forward(query, key, value, *args)

    def _attnkit_forward(
        self, query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights,
        is_causal,
    ):  # fmt: skip
        batched = self._check(query, key, value)
        if batched and self.batch_first:
            pass  # already (B, L, E)
        elif batched:
            query, key, value = _batch_first(query, key, value)  # (B, L, E), (B, S, kdim), ...
        else:
            query, key, value = query[None], key[None], value[None]  # (1, L, E), ...
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask[None]  # (1, S)
        b, n, s = query.shape[0], query.shape[1], key.shape[1]
        q, k, v = self._project(query, key, value)  # (B, H, L, D), (B, H, S', D) twice
        extra = k.shape[2] - s  # bias_k and zero-attention columns, which every query sees
        mask, bias, causal = self._masks(
            b, n, s, extra, key_padding_mask, attn_mask, is_causal, need_weights, query.device
        )
        try:
            res = attention(
                q, k, v, mask=mask, bias=bias, causal=causal, dropout_p=self.dropout,
                training=self.training, need_weights=need_weights,
            )  # fmt: skip
        except ValueError as e:  # attnkit's message, as the class torch raises (RuntimeError)
            raise TorchRuntimeError(f"MultiheadAttention: {e}") from None
        out = res.out.transpose(1, 2).reshape(b, n, self.embed_dim)  # (B, L, E)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias)
        weights = res.weights  # (B, H, L, S') or None
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)  # (B, L, S')
        if not batched:
            return out[0], None if weights is None else weights[0]
        return (out if self.batch_first else out.transpose(0, 1)), weights

    def _torch_forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        attn_mask: Tensor | None,
        average_attn_weights: bool,
        is_causal: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """torch's own computation with this module's weights, for TorchScript."""
        swap = self.batch_first and query.dim() == 3  # torch's functional reads (L, B, E)
        if swap:
            query, key, value = query.transpose(1, 0), key.transpose(1, 0), value.transpose(1, 0)
        out, weights = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight,
            self.in_proj_bias, self.bias_k, self.bias_v, self.add_zero_attn, self.dropout,
            self.out_proj.weight, self.out_proj.bias, training=self.training,
            key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
            use_separate_proj_weight=not self._qkv_same_embed_dim,
            q_proj_weight=self.q_proj_weight, k_proj_weight=self.k_proj_weight,
            v_proj_weight=self.v_proj_weight, average_attn_weights=average_attn_weights,
            is_causal=is_causal,
        )  # fmt: skip
        return (out.transpose(1, 0) if swap else out), weights

    def _check(self, query, key, value) -> bool:
        """Whether the call is batched; ValueError naming the argument otherwise."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor):
                raise TorchAssertionError(f"{name} must be a tensor, got {type(t).__name__}")
            if t.is_nested:
                raise TorchAssertionError(f"{name}: nested tensors are not supported (pad them)")
        batched = query.dim() == 3
        if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
            raise TorchAssertionError(
                "query, key and value must all be batched (rank 3) or all unbatched (rank 2), "
                f"got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
            )
        layout = ("B, L" if self.batch_first else "L, B") if batched else "L"
        klayout = layout.replace("L", "S")
        for name, t, width, lay in (
            ("query", query, self.embed_dim, layout),
            ("key", key, self.kdim, klayout),
            ("value", value, self.vdim, klayout),
        ):
            if t.shape[-1] != width:
                raise TorchAssertionError(
                    f"{name} must have shape ({lay}, {width}), got {tuple(t.shape)}"
                )
        if key.shape[:-1] != value.shape[:-1]:
            raise TorchAssertionError(
                f"key and value must share ({klayout}), got {tuple(key.shape)} and "
                f"{tuple(value.shape)}"
            )
        if batched:
            bdim = 0 if self.batch_first else 1
            if key.shape[bdim] != query.shape[bdim]:
                raise TorchAssertionError(
                    f"key has batch {key.shape[bdim]}, query {query.shape[bdim]} ({layout}, E)"
                )
        self._check_dtypes(query, key, value)
        return batched

    def _check_dtypes(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        """Inputs of the projection weights' dtype (torch's matmul error otherwise); under
        autocast, whatever autocast takes."""
        w = self.in_proj_weight if self._qkv_same_embed_dim else self.q_proj_weight
        if torch.is_autocast_enabled(query.device.type):
            return
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.dtype != w.dtype:
                raise TorchRuntimeError(
                    f"{name} has dtype {t.dtype}, the module's weights {w.dtype}: convert the "
                    f"input (.to({w.dtype})) or the module (.to({t.dtype}))"
                )

    def _project(self, query: Tensor, key: Tensor, value: Tensor):
        """In-projections and heads: q (B, H, L, D); k, v (B, H, S', D) with the bias_k/bias_v
        position and the zero-attention position appended, in torch's order."""
        e, h = self.embed_dim, self.num_heads
        bias = self.in_proj_bias
        if bias is not None and bias.dtype != query.dtype:
            # torch adds a bias of another dtype with type promotion (its test
            # test_multihead_attn_fast_path_query_and_bias_have_different_dtypes); F.linear
            # refuses it, so the bias takes the input's dtype first
            bias = bias.to(query.dtype)
        bq, bk, bv = (None, None, None) if bias is None else bias.chunk(3)
        if not self._qkv_same_embed_dim:
            q = F.linear(query, self.q_proj_weight, bq)
            k = F.linear(key, self.k_proj_weight, bk)
            v = F.linear(value, self.v_proj_weight, bv)
        elif query is key and key is value:  # self-attention: one matmul
            q, k, v = F.linear(query, self.in_proj_weight, bias).chunk(3, dim=-1)
        else:
            w = self.in_proj_weight
            q = F.linear(query, w[:e], bq)
            if key is value:
                kv_bias = None if bias is None else bias[e:]
                k, v = F.linear(key, w[e:], kv_bias).chunk(2, dim=-1)
            else:
                k, v = F.linear(key, w[e : 2 * e], bk), F.linear(value, w[2 * e :], bv)
        if self.bias_k is not None:
            b = key.shape[0]
            k = torch.cat([k, self.bias_k.to(k.dtype).expand(b, 1, e)], dim=1)  # (B, S + 1, E)
            v = torch.cat([v, self.bias_v.to(v.dtype).expand(b, 1, e)], dim=1)
        q = q.unflatten(-1, (h, -1)).transpose(1, 2)  # (B, H, L, D)
        k = k.unflatten(-1, (h, -1)).transpose(1, 2)  # (B, H, S', D)
        v = v.unflatten(-1, (h, -1)).transpose(1, 2)  # (B, H, S', D)
        if self.add_zero_attn:
            zeros = k.new_zeros(*k.shape[:2], 1, k.shape[3])  # (B, H, 1, D)
            k, v = torch.cat([k, zeros], dim=2), torch.cat([v, zeros.to(v.dtype)], dim=2)
        return q, k, v

    def _masks(self, b, n, s, extra, key_padding_mask, attn_mask, is_causal, need_weights, dev):
        """torch's masks as attnkit's (mask True = may attend (B|1, H|1, L|1, S'), float bias
        (B|1, H|1, L|1, S'), causal), the `extra` appended key columns always allowed."""
        if is_causal and attn_mask is None:
            raise TorchRuntimeError(
                "is_causal=True is torch's hint that attn_mask is the causal mask: pass "
                "attn_mask too (torch.nn.Transformer.generate_square_subsequent_mask(L))"
            )
        if is_causal and key_padding_mask is None and not need_weights:
            # torch replaces attn_mask by SDPA's is_causal here: top-left aligned over S'
            s_all = s + extra
            if n == s_all:
                return None, None, True
            return top_left_causal(n, s_all, dev), None, False
        mask = bias = None
        if attn_mask is not None:
            if attn_mask.dim() == 2 and tuple(attn_mask.shape) == (n, s):
                m = attn_mask[None, None]  # (1, 1, L, S)
            elif attn_mask.dim() == 3 and tuple(attn_mask.shape) == (b * self.num_heads, n, s):
                m = attn_mask.view(b, self.num_heads, n, s)  # (B, H, L, S)
            else:
                # torch: AssertionError for a rank other than 2 or 3, RuntimeError for sizes
                err = TorchRuntimeError if attn_mask.dim() in (2, 3) else TorchAssertionError
                raise err(
                    f"attn_mask must have shape (L, S) = ({n}, {s}) or (B·H, L, S) = "
                    f"({b * self.num_heads}, {n}, {s}), got {tuple(attn_mask.shape)}"
                )
            mask, bias = _split(m, "attn_mask", extra)
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (b, s):
                want = f"(B, S) = ({b}, {s})" if b > 1 or key_padding_mask.dim() == 2 else f"({s},)"
                raise TorchAssertionError(
                    f"key_padding_mask must have shape {want}, got {tuple(key_padding_mask.shape)}"
                )
            kmask, kbias = _split(key_padding_mask[:, None, None], "key_padding_mask", extra)
            mask = kmask if mask is None else (mask if kmask is None else mask & kmask)
            bias = kbias if bias is None else (bias if kbias is None else bias + kbias)
        return mask, bias, False


def _split(m: Tensor, name: str, extra: int) -> tuple[Tensor | None, Tensor | None]:
    """A torch mask (True = not allowed, or float added) as (allowed, None) or (None, bias),
    with `extra` allowed columns appended (bias_k, zero attention)."""
    if m.dtype == torch.bool:
        allowed = ~m
        if extra:
            allowed = F.pad(allowed, (0, extra), value=True)
        return allowed, None
    if not m.is_floating_point():
        raise TorchAssertionError(
            f"{name} must be boolean (True = not allowed) or floating, got {m.dtype}"
        )
    return None, (F.pad(m, (0, extra)) if extra else m)


def _batch_first(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(L, B, E) -> (B, L, E), keeping `query is key is value` (the one-matmul path reads it)."""
    q = query.transpose(0, 1)
    k = q if key is query else key.transpose(0, 1)
    v = k if value is key else (q if value is query else value.transpose(0, 1))
    return q, k, v
