"""Text generation for decoder-only models (`GPT`, `CausalLM`): greedy or sampled, with a cache.

Dimensions: B batch, P prompt length, T tokens generated so far, S tokens in the
model's window (cached + new), V vocabulary.

A model here is called as ``model(ids (B, N), cache=KVCache, attention_mask=(B, S))
-> logits (B, N, V)`` (the mask only when the batch has padding) and has a
``context``: the most tokens it sees at once. Each step picks the next token
from the last logits, in the order of Hugging Face's logits warpers:
temperature, then top-k, then top-p (nucleus, Holtzman et al. 2020); temperature
0 is greedy (argmax). When the cache is full the window slides as in nanoGPT:
the last `context` tokens are encoded again, from position 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnkit.models.decoding import KVCache
from attnkit.modules._checks import per_token

__all__ = ["filter_logits", "generate"]


@torch.no_grad()
def generate(
    model: nn.Module,
    ids: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    attention_mask: Tensor | None = None,
    document_ids: Tensor | None = None,
) -> Tensor:
    """Continue the prompts ids (B, P) by up to `max_new_tokens` tokens -> (B, P + T).

    temperature: 0 = greedy (the argmax of the full forward's logits); > 0 divides
        the logits before sampling.
    top_k: sample among the k most likely tokens only.
    top_p: sample among the fewest most likely tokens whose probability sums to >= top_p.
    eos_id: a row that emits it stops; its later positions are `eos_id` too. Generation
        ends early when every row has stopped (so T <= max_new_tokens).
    generator: the random source of sampling (same seed, same tokens).
    attention_mask: (B, P), True / 1 = real token; prompts of different lengths are
        left-padded (the last column is real in every row). Each row then gets the
        tokens it would get alone. The padding stays in the returned ids.
    document_ids: (B, P) or (P,) document ids of packed prompts (several documents per row, as
        `GPT(ids, document_ids=)` takes them): each row continues its last document, and
        gets the tokens that document would get alone (a document sees only itself, so the
        earlier ones are not even encoded: they count as padding). They stay in the
        returned ids; the new tokens belong to the last document.
    """
    context = _check(model, ids, max_new_tokens, temperature, top_k, top_p, attention_mask)
    if document_ids is not None:
        attention_mask = _last_documents(document_ids, ids, attention_mask)
    batch, p = ids.shape
    keep = None  # (B, P + max_new) True = real token, only when there is padding
    if attention_mask is not None and not bool(attention_mask.all()):
        keep = torch.ones(batch, p + max_new_tokens, dtype=torch.bool, device=ids.device)
        keep[:, :p] = attention_mask != 0
    done = torch.zeros(batch, 1, dtype=torch.bool, device=ids.device)
    out = [ids]  # (B, P), then (B, 1) per new token: joined once, at the end or a slide
    n = p  # tokens so far
    cache, window, logits = _encode(model, ids, _cut(keep, n), context)
    for _ in range(max_new_tokens):
        nxt = _pick(logits, temperature, top_k, top_p, generator)  # (B, 1)
        if eos_id is not None:
            nxt = nxt.masked_fill(done, eos_id)
            done |= nxt == eos_id
        out.append(nxt)
        n += 1
        if n == p + max_new_tokens or (eos_id is not None and bool(done.all())):
            break
        if cache.length == context:  # full: slide the window (nanoGPT crops the same way)
            out = [torch.cat(out, 1)]  # (B, n)
            cache, window, logits = _encode(model, out[0], _cut(keep, n), context)
        elif window is None:
            logits = model(nxt, cache=cache).select(1, -1)  # (B, V): no mask work at all
        else:
            window[:, cache.length] = True  # the new token is real
            mask = window[:, : cache.length + 1]  # (B, S): a view of the buffer
            logits = model(nxt, cache=cache, attention_mask=mask).select(1, -1)
    return torch.cat(out, 1).to(ids.dtype)  # cat promotes int32 ids to the picks' int64


def _last_documents(docs: Tensor, ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """(B, P) True where a token belongs to its row's last document (and is real)."""
    docs = per_token(docs, *ids.shape, name="document_ids")  # (B|1, P)
    last = (docs == docs[:, -1:]).expand(ids.shape)  # (B, P)
    return last if attention_mask is None else last & (attention_mask != 0)


def _cut(keep: Tensor | None, n: int) -> Tensor | None:
    return None if keep is None else keep[:, :n]


def _encode(
    model: nn.Module, ids: Tensor, keep: Tensor | None, context: int
) -> tuple[KVCache, Tensor | None, Tensor]:
    """Encode the last `context` real tokens of each row (left-padded again) into a new cache.

    Returns the cache (preallocated for `context` positions), the window's padding
    mask (B, context) to be extended in place (None without padding) and the
    logits (B, V) for the next token.
    """
    cache = KVCache(capacity=context)
    cache.loop_model = model  # only this loop's code runs between the steps (see KVCache)
    if keep is None:
        return cache, None, model(ids[:, -context:], cache=cache)[:, -1]
    ids, window = _last_real(ids, keep, context)
    logits = model(ids, cache=cache, attention_mask=window[:, : ids.shape[1]])
    return cache, window, logits[:, -1]


def _last_real(ids: Tensor, keep: Tensor, context: int) -> tuple[Tensor, Tensor]:
    """Each row's last min(real, context) real tokens, left-padded to the longest:
    ids (B, W) and a mask buffer (B, context) whose first W columns mark them."""
    count = keep.sum(-1).clamp(max=context)  # (B,)
    width = int(count.max())
    out = ids.new_zeros(ids.shape[0], width)
    window = torch.zeros(ids.shape[0], context, dtype=torch.bool, device=ids.device)
    for row in range(ids.shape[0]):  # once per slide, not per step
        real = ids[row][keep[row]][-context:]
        out[row, width - real.numel() :] = real
        window[row, width - real.numel() : width] = True
    return out, window


def filter_logits(
    logits: Tensor, *, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """logits (B, V) with the tokens outside the top-k / top-p set at -inf (new tensor)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V) each
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens more likely than it already reach top_p: the most
        # likely token is always kept, and the kept set is the smallest reaching top_p.
        drop = probs.cumsum(-1) - probs >= top_p  # (B, V)
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def _pick(logits, temperature, top_k, top_p, generator) -> Tensor:
    """The next token (B, 1) from logits (B, V)."""
    if temperature == 0.0:
        return logits.argmax(-1, keepdim=True)
    logits = filter_logits(logits.float() / temperature, top_k=top_k, top_p=top_p)
    probs = logits.softmax(-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator)


def _check(model, ids, max_new_tokens, temperature, top_k, top_p, attention_mask) -> int:
    context = getattr(model, "context", None)
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"model must have an integer `context` >= 1, got {context!r}")
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point:
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"ids must be integer token ids of shape (B, P), got {got}")
    if ids.shape[1] < 1 or ids.shape[0] < 1:
        raise ValueError(f"ids must hold at least one token per row, got shape {tuple(ids.shape)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if (
        not (isinstance(temperature, (int, float)) and math.isfinite(temperature))
        or temperature < 0
    ):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be None or in (0, 1], got {top_p!r}")
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != ids.shape:
            got = (
                tuple(attention_mask.shape)
                if isinstance(attention_mask, Tensor)
                else attention_mask
            )
            raise ValueError(
                f"attention_mask must have the shape of ids {tuple(ids.shape)}, got {got}"
            )
        if not bool((attention_mask[:, -1] != 0).all()):
            raise ValueError(
                "attention_mask: prompts must be left-padded (the last token of every row real)"
            )
    return context
