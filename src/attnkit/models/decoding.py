"""Incremental decoding: a key/value cache, greedy search and beam search.

Dimensions: B batch, K beams, N new query positions, S key length (source
length for cross-attention, decoded length for self-attention), T target length,
V vocabulary, C model width, H heads, Hkv key/value heads, Dh head width.

The cache keeps, for every attention of a decoder, the keys and values it has
already computed: self-attention appends the new positions at each step (the
new queries see every cached key — `attention`'s causal mask is bottom-right
aligned when N != S, so it holds for any number of new tokens); cross-attention
projects the encoder output once, at the first step. `CachedMultiHeadAttention`
does this with `MultiHeadAttention`'s own pieces (`heads_qkv`, `attend`,
`merge_heads`, `proj`), so there is one attention implementation.

`greedy` and `beam_search` need a model with

* ``encode(src) -> (memory (B, S, C), memory_mask (B, 1, 1, S) bool, True = may attend)``
* ``decode(tgt (B, N), memory, memory_mask, cache=KVCache) -> logits (B, N, V)``

(`attnkit.models.transformer.Transformer` has both).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module

from attnkit.functional.attention import attention_without_checks
from attnkit.modules._recording import sinks as recording_sinks
from attnkit.modules.attention import Attend, MultiHeadAttention
from attnkit.modules.projection import FusedQKV

__all__ = ["CachedMultiHeadAttention", "KVCache", "beam_search", "greedy"]


class KVCache:
    """Keys and values of a decoder's attentions, kept across decoding steps.

    `entries[module] = (k, v)`, each (B, Hkv, S, Dh): for self-attention S grows
    by the new positions of each step; for cross-attention S is the source length.
    `length` is the number of target positions decoded so far, i.e. the
    positional offset of the next token (advanced by the model's `decode`).

    capacity: None (default) grows each self-attention entry with `torch.cat`,
    which copies the whole cache at every step. With ``capacity=S_max`` the
    first `append` of a module allocates (B, Hkv, S_max, Dh) buffers and later
    steps write the new keys in place; `entries` then holds views of the filled
    part. This is what fast decoders do (one copy of one token per step), but
    the in-place writes make it an inference cache: backpropagating through
    an earlier step's output after a later append raises autograd's
    "modified by an inplace operation" error.

    `loop_model` and `memo`: a decoding loop that calls one model and runs nothing else
    between its steps (`generate`, when that model has no hooks of its own) names the model
    in `loop_model`; that model may then keep in `memo` what it validated at the first step
    (`GPT`'s module-free step keeps its plan: ~30 µs a step), since no code that could change
    the model runs until the loop ends. A cache used by hand leaves `loop_model` None.
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be None or an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        self.entries: dict[nn.Module, tuple[Tensor, Tensor]] = {}
        self.buffers: dict[nn.Module, tuple[Tensor, Tensor]] = {}  # (B, Hkv, S_max, Dh) x2
        self.length = 0
        self.loop_model: nn.Module | None = None
        self.memo: dict = {}

    def append(self, module: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add `module`'s new keys/values (B, Hkv, N, Dh); return all of them (B, Hkv, S, Dh)."""
        past = self.entries.get(module)
        start = 0 if past is None else past[0].shape[2]
        if self.capacity is None:
            if past is not None:
                k = torch.cat([past[0], k], dim=2)  # (B, Hkv, S_past + N, Dh)
                v = torch.cat([past[1], v], dim=2)  # (B, Hkv, S_past + N, Dh)
        else:
            end = start + k.shape[2]
            if end > self.capacity:
                raise ValueError(
                    f"KVCache(capacity={self.capacity}) is full: {start} keys cached, "
                    f"{k.shape[2]} new; start a new cache (or slide the window)"
                )
            if module not in self.buffers:
                shape = (*k.shape[:2], self.capacity, k.shape[3])  # (B, Hkv, S_max, Dh)
                self.buffers[module] = (k.new_empty(shape), v.new_empty(*shape[:3], v.shape[3]))
            kb, vb = self.buffers[module]
            # narrow + copy_: the same writes as kb[:, :, start:end] = k, with less Python
            kb.narrow(2, start, end - start).copy_(k)
            vb.narrow(2, start, end - start).copy_(v)
            k, v = kb.narrow(2, 0, end), vb.narrow(2, 0, end)  # (B, Hkv, S, Dh) views
        self.entries[module] = (k, v)
        return k, v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (M,) of every entry, in that order (beam search)."""
        self.buffers = {
            m: (k.index_select(0, index), v.index_select(0, index))
            for m, (k, v) in self.buffers.items()
        }
        self.entries = {
            m: (k.index_select(0, index), v.index_select(0, index))
            if m not in self.buffers
            else tuple(b[:, :, : k.shape[2]] for b in self.buffers[m])
            for m, (k, v) in self.entries.items()
        }

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values (the buffers' full size when preallocated)."""
        held = {**self.entries, **self.buffers}
        return sum(t.numel() * t.element_size() for kv in held.values() for t in kv)


class CachedMultiHeadAttention(MultiHeadAttention):
    """`MultiHeadAttention` whose forward also takes a `KVCache`.

    Without a cache it is exactly `MultiHeadAttention.forward`. With one:

    * self-attention (``context=None``): the keys/values of the N new positions
      are appended to this module's entry; the new queries attend to all of
      them. Pass ``causal=True`` for a decoder: the mask is aligned bottom-right,
      so query i of the N new ones sees the S - N cached keys and new keys <= i
      (for N = 1 that is every key, so no causal mask is built).
    * cross-attention: the context's keys/values are projected at the first
      call and reused afterwards (the context must not change between calls).

    mask: boolean, True = may attend, broadcastable to (B, H, N, S) — for
    cross-attention the source padding mask (B, 1, 1, S).
    bias: additive (B, H, N, S) over all S cached + new keys, e.g. ALiBi or T5
    bias for the last N of S positions (`attnkit.modules.AlibiBias(n, s)`); or, without the
    (N, S) tensor, ``score_mod=AlibiBias.score_mod(n, s)`` (`attnkit.score_mods`).
    With a `rotary` embedding the new queries and keys are rotated at positions
    S_past .. S_past + N - 1, S_past the cached length (= `cache.length` when
    every step goes through this module).
    """

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        pos: Tensor | None = None,
        context_pos: Tensor | None = None,
        position_ids: Tensor | None = None,
        score_mod=None,
    ) -> Tensor:
        """x (B, N, C), context (B, S, Cc) or None -> (B, N, Co); `pos` (B, N, C),
        `context_pos` (B, S, Cc) and `position_ids` (N,) or (B, N) as in
        `MultiHeadAttention.forward` (with a cache, `pos` and `position_ids` are those of the
        N new queries only)."""
        if cache is None:
            return super().forward(
                x, context, mask=mask, bias=bias, causal=causal, pos=pos, context_pos=context_pos,
                position_ids=position_ids, score_mod=score_mod,
            )  # fmt: skip
        plain = position_ids is None and score_mod is None
        if plain and self._one_new_token(x, context, mask, bias, pos):
            return self._decode_one(x, cache)
        cached = cache.entries.get(self)
        if context is None:
            q, k, v = self.heads_qkv(x, pos=pos)  # (B, H, N, Dh), (B, Hkv, N, Dh) x2
            # RoPE: the new tokens sit after the cached ones (cached keys are already rotated),
            # or at the positions given (a packed prompt's: they restart at each document).
            offset = 0 if cached is None else cached[0].shape[2]
            q, k = self.rotate(q, k, offset=offset, position_ids=position_ids)
            k, v = cache.append(self, k, v)  # (B, Hkv, S_past + N, Dh) x2
            # One new query sees every cached key: the bottom-right causal mask is all
            # True, so skip it (attention then needs no mask work at all).
            causal = causal and q.shape[2] > 1
        elif cached is None:
            q, k, v = self.heads_qkv(x, context, pos=pos, context_pos=context_pos)
            q, k = self.rotate(q, k, context, position_ids=position_ids)  # refuses rotary here
            cache.entries[self] = (k, v)
        else:
            # An empty context projects only the queries; the keys/values are cached.
            q, _, _ = self.heads_qkv(x, context[:, :0], pos=pos)  # (B, H, N, Dh)
            k, v = cached
        o = self.attend(q, k, v, mask=mask, bias=bias, causal=causal, score_mod=score_mod).out
        return self.proj(self.merge_heads(o))  # o: (B, H, N, Dh)

    def _one_new_token(self, x, context, mask, bias, pos) -> bool:
        """Whether this call is the plain decode step `_decode_one` serves: one new token of
        self-attention through the fused projection, no mask, bias or positions."""
        return (
            context is None
            and mask is None
            and bias is None
            and pos is None
            and isinstance(x, Tensor)
            and x.dim() == 3
            and x.shape[1] == 1
            and x.shape[2] == self.dim
            and isinstance(self.in_proj, FusedQKV)
        )

    def _decode_one(self, x: Tensor, cache: KVCache) -> Tensor:
        """One new token x (B, 1, C) over the cache -> (B, 1, Co).

        The same computation as the general path (the same projection weights, `rotate`,
        `KVCache.append` and `Attend`, so hooks and recording still see it), with the Python
        work of a decode step cut: one query needs no causal mask, and with one token the head
        split is a view, not a transpose. (`GPT` in eval mode calls `decode_core` directly.)
        """
        in_proj = self.in_proj
        widths = (in_proj.q_width, in_proj.k_width, in_proj.v_width)
        o = self.decode_core(in_proj.qkv(x), cache, self.attend, widths)  # (B, 1, H·Dv)
        return self.proj(o)

    def decode_core(
        self,
        qkv: Tensor,
        cache: KVCache,
        attend: nn.Module,
        widths: tuple[int, int, int],
        plain: bool | None = None,
    ) -> Tensor:
        """The step between the projections: qkv (B, 1, Q + K + V) of one new token ->
        attention output (B, 1, H·Dv), appending the new key and value to `cache`.

        `attend` and `widths` (Q, K, V) are this module's (`self.attend`, `in_proj`'s), passed
        in so that a caller holding them (`attnkit.models.gpt_step`) skips the attribute
        lookups, a few µs per token and layer; so is `plain` (what `_plain(attend)` says,
        None = ask it here), for a caller that has just checked it.
        """
        b, h, hkv = qkv.shape[0], self.num_heads, self.num_kv_heads
        q, k, v = qkv.split(widths, dim=-1)
        q = q.view(b, h, 1, self.head_dim)  # (B, H, 1, Dk)
        k = k.view(b, hkv, 1, self.head_dim)  # (B, Hkv, 1, Dk)
        v = v.view(b, hkv, 1, self.v_head_dim)  # (B, Hkv, 1, Dv)
        if self.rotary is not None:
            cached = cache.entries.get(self)
            q, k = self.rotate(q, k, offset=0 if cached is None else cached[0].shape[2])
        k, v = cache.append(self, k, v)  # (B, Hkv, S, Dk), (B, Hkv, S, Dv)
        if plain is None:
            plain = _plain(attend)
        o = None
        if plain:  # nothing watches Attend: the same call without its checks
            o = attention_without_checks(q, k, v, scale=attend.scale, backend=attend.backend)
        if o is None:
            o = attend(q, k, v, mask=None, bias=None, causal=False).out  # (B, H, 1, Dv)
        return o.view(b, 1, h * self.v_head_dim)


def _plain(attend: nn.Module) -> bool:
    """Whether calling `attend` would only compute attention: exactly an `Attend`, no hook, no
    recording, no dropout in force (so its result is `attention_without_checks`' whenever that
    applies)."""
    return not (
        type(attend) is not Attend
        or attend.need_weights
        or recording_sinks(attend)
        or (attend.training and attend.dropout > 0)
        or attend._forward_hooks
        or attend._forward_pre_hooks
        or global_hooks()
    )


def global_hooks() -> bool:
    """Whether a global module hook (`torch.nn.modules.module.register_module_*_hook`) is set."""
    return bool(
        _module._global_forward_hooks
        or _module._global_forward_pre_hooks
        or _module._global_backward_hooks
        or _module._global_backward_pre_hooks
    )


def _check_src(src: Tensor, max_len: int) -> None:
    if not isinstance(src, Tensor) or src.dim() != 2 or src.dtype.is_floating_point:
        got = tuple(src.shape) if isinstance(src, Tensor) else type(src).__name__
        raise ValueError(f"src must be integer token ids of shape (B, S), got {got}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")


@torch.no_grad()
def greedy(model: nn.Module, src: Tensor, *, bos: int, eos: int, pad: int, max_len: int) -> Tensor:
    """Greedy decoding with a key/value cache.

    src: (B, S) token ids, padded with `pad`. Returns (B, T) token ids without
    the BOS, T <= max_len; a row ends with its first EOS and is `pad` after it.
    """
    _check_src(src, max_len)
    memory, memory_mask = model.encode(src)
    cache = KVCache()
    batch = src.shape[0]
    token = torch.full((batch, 1), bos, dtype=torch.long, device=src.device)  # (B, 1)
    done = torch.zeros(batch, dtype=torch.bool, device=src.device)
    out = []
    for _ in range(max_len):
        logits = model.decode(token, memory, memory_mask, cache=cache)  # (B, 1, V)
        token = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        token = token.masked_fill(done[:, None], pad)
        out.append(token)
        done |= token[:, 0] == eos
        if bool(done.all()):
            break
    return torch.cat(out, dim=1)


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    *,
    bos: int,
    eos: int,
    pad: int,
    max_len: int,
    beam_size: int = 4,
    length_penalty: float = 0.6,
) -> Tensor:
    """Beam search with a key/value cache (one cache row per beam).

    Hypotheses are ranked by log p / lp(T) with lp(T) = ((5 + T) / 6)^α
    (Wu et al. 2016, §7; the Transformer paper uses α = 0.6, §6.1). A beam
    that emitted EOS is frozen: it is extended only by `pad` at no cost.
    src: (B, S) padded with `pad`. Returns the best hypothesis per row, (B, T)
    without the BOS, `pad` after the first EOS.
    """
    _check_src(src, max_len)
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    batch, k = src.shape[0], beam_size
    memory, memory_mask = model.encode(src)
    memory = memory.repeat_interleave(k, dim=0)  # (B·K, S, C)
    memory_mask = memory_mask.repeat_interleave(k, dim=0)  # (B·K, 1, 1, S)
    cache = KVCache()
    device = src.device
    tokens = torch.full((batch * k, 1), bos, dtype=torch.long, device=device)  # (B·K, 1)
    # Only the first beam is live at the start, so the K beams do not duplicate.
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    done = torch.zeros(batch, k, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch, k, device=device)
    for _ in range(max_len):
        logits = model.decode(tokens[:, -1:], memory, memory_mask, cache=cache)  # (B·K, 1, V)
        logp = logits[:, -1].float().log_softmax(-1).view(batch, k, -1)  # (B, K, V)
        vocab = logp.shape[-1]
        frozen = torch.full_like(logp, float("-inf"))
        frozen[..., pad] = 0.0
        logp = torch.where(done[..., None], frozen, logp)
        total = (scores[..., None] + logp).view(batch, k * vocab)  # (B, K·V)
        scores, flat = total.topk(k, dim=-1)  # (B, K)
        beam, token = flat // vocab, flat % vocab  # (B, K) each
        rows = (beam + torch.arange(batch, device=device)[:, None] * k).view(-1)  # (B·K,)
        tokens = torch.cat([tokens.index_select(0, rows), token.view(-1, 1)], dim=1)
        cache.reorder(rows)
        done = done.gather(1, beam)
        lengths = lengths.gather(1, beam) + (~done).float()
        done = done | (token == eos)
        if bool(done.all()):
            break
    penalty = ((5.0 + lengths) / 6.0) ** length_penalty  # (B, K)
    best = (scores / penalty).argmax(-1)  # (B,)
    rows = best + torch.arange(batch, device=device) * k
    return tokens.index_select(0, rows)[:, 1:]
