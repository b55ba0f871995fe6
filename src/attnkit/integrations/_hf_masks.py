"""transformers' masks as attnkit descriptions, for the ``"attnkit"`` backend.

transformers 5.x builds every layer's mask from a *mask function* (``masking_utils``): a
predicate ``f(batch_idx, head_idx, q_idx, kv_idx)`` composed of closures — the causal and
bidirectional functions, the sliding-window and chunk overlays, ``and_masks``, and, for
packed sequences it detects itself, ``remap_positions_for_packed_sequence`` and
``packed_sequence_mask_function``. It then hands that function to the mask interface of the
model's attention implementation (``sdpa_mask`` builds the dense (B, 1, N, S) tensor from it,
``flex_attention_mask`` a ``BlockMask``).

attnkit's interface (`layer_mask`) reads the composition back. Where every part is one it
knows, the mask becomes row intervals — query i may attend keys lo_i <= j < hi_i — with
document ids for packed sequences (`attnkit.masks.document`), so the kernels skip what is
masked and nothing N x S is built. Anything else (``or_masks`` overlays of image tokens, a
user's mask function, offsets held in tensors by static caches, traced code) is built dense
by transformers' own ``sdpa_mask``, as before.

Packing that transformers does not see in the mask (it detects it only without a 2-D
attention mask and without a cache, so not in a model's default ``use_cache=True`` eval mode,
and never for encoders) reaches the attention call as keyword arguments: `documents` reads
``cu_seq_lens_q/k`` (what ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``
gives) and position ids that restart, as the flash-attention backends do; `with_documents`
then rebuilds the layer's description per document (chunks restart at each document).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor
from transformers import masking_utils as mu

from attnkit.functional._trace import tracing
from attnkit.functional.structured import RowIntervals, StructuredMask, document, document_ids

__all__ = ["documents", "is_padded", "layer_mask", "with_documents"]


def _code(factory: str, *args):
    """The code object of the closure ``masking_utils.<factory>(*args)`` returns (the same on
    every call), or None where this version of transformers has no such factory."""
    make = getattr(mu, factory, None)
    return None if make is None else make(*args).__code__


# A function is recognised by its code, never by its name; a version of transformers that
# composes its masks otherwise gets its own dense masks, as before.
_PROBE = torch.zeros(1, 1, dtype=torch.long)
_AND = _code("and_masks", mu.causal_mask_function)
_SLIDE = _code("sliding_window_overlay", 1)
_SLIDE_BOTH = _code("sliding_window_bidirectional_overlay", 1)
_CHUNK = _code("chunked_overlay", 1, _PROBE)
_SAME_DOC = _code("packed_sequence_mask_function", _PROBE)
_REMAP = _code("remap_positions_for_packed_sequence", mu.causal_mask_function, _PROBE)

# What each description `layer_mask` built was built from, so that packing found in the
# attention call's arguments can rebuild it per document (`with_documents`).
_BUILT: weakref.WeakKeyDictionary[StructuredMask, _Built] = weakref.WeakKeyDictionary()


@dataclass
class _Pattern:
    """What a mask function allows, relative to the query's key position p: keys
    p + lo <= j < p + hi (None: no bound on that side), within the query's document."""

    lo: int | None = None
    hi: int | None = None
    docs: Tensor | None = None  # (B, N) ids of transformers' packed_sequence_mask
    positions: Tensor | None = None  # (B, N) the per-document positions of a remapped mask
    chunk: tuple[int, Tensor] | None = None  # Llama 4: (chunk size, left padding (B,))
    causal: bool = False

    def bound(self, lo: int | None = None, hi: int | None = None) -> None:
        if lo is not None:
            self.lo = lo if self.lo is None else max(self.lo, lo)
        if hi is not None:
            self.hi = hi if self.hi is None else min(self.hi, hi)


def _cells(fn) -> dict[str, Any]:
    """The variables closure `fn` closed over, by name."""
    names = fn.__code__.co_freevars
    return dict(zip(names, (c.cell_contents for c in fn.__closure__ or ()), strict=True))


def _known(fn, out: _Pattern) -> bool:
    """`_read`, with a closure whose variables are not the expected ones read as unknown."""
    try:
        return _read(fn, out)
    except (KeyError, TypeError, ValueError):
        return False


def _read(fn, out: _Pattern) -> bool:
    """Fold mask function `fn` into `out`; False where some part of it is not known."""
    if fn is mu.causal_mask_function:
        out.bound(hi=1)  # kv <= q
        out.causal = True
        return True
    if fn is mu.bidirectional_mask_function:
        return True
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    if code is _AND:
        return all(_read(f, out) for f in _cells(fn)["mask_functions"])
    if code is _SLIDE:  # kv > q - w
        out.bound(lo=1 - int(_cells(fn)["sliding_window"]))
        return True
    if code is _CHUNK:  # (kv - left) // c == (q - left) // c: the query's chunk
        cells = _cells(fn)
        if out.chunk is not None:
            return False
        out.chunk = (int(cells["chunk_size"]), cells["left_padding"])
        return True
    if code is _SLIDE_BOTH:  # |q - kv| <= w
        w = int(_cells(fn)["sliding_window"])
        out.bound(lo=-w, hi=w + 1)
        return True
    if code is _SAME_DOC:
        docs = _cells(fn)["packed_sequence_mask"]
        if out.docs is not None and out.docs is not docs:
            return False
        out.docs = docs
        return True
    if code is _REMAP:
        # Within one of transformers' packed documents positions rise by exactly 1 per token
        # (that is how it finds them), so the remapped function means the same on pairs of
        # one document; `layer_mask` requires the document ids beside it. Chunks count from
        # each document's start: they need the positions themselves.
        cells = _cells(fn)
        if out.positions is not None:
            return False
        out.positions = cells["position_ids"]
        return _read(cells["mask_function"], out)
    return False


def _padding(attention_mask: Tensor | None, kv_length: int, kv_offset: int) -> Tensor | None:
    """The keys' padding (B, S), True = a real token; None when there is none."""
    padding = mu.prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if padding is None:
        return None
    padding = padding[:, kv_offset : kv_offset + kv_length].bool()  # (B, S)
    return None if bool(padding.all()) else padding


def _key_padding(padding: Tensor, n: int) -> StructuredMask:
    """Key padding (B, S), True = a real token, for N queries: row intervals where each row's
    real tokens are contiguous (left or right padding), else the (B, 1, 1, S) booleans."""
    b, s = padding.shape
    count = padding.sum(1)  # (B,)
    first = padding.int().argmax(1)
    last = s - 1 - padding.flip(1).int().argmax(1)
    if bool(((count == 0) | (last - first + 1 == count)).all()):
        lo = torch.where(count > 0, first, s)[:, None].expand(b, n)  # (B, N)
        hi = torch.where(count > 0, last + 1, 0)[:, None].expand(b, n)
        return RowIntervals(lo, hi, s, "padding")
    zeros = torch.zeros(1, n, dtype=torch.long, device=padding.device)
    every = RowIntervals(zeros, zeros + s, s)
    return every & padding[:, None, None, :]  # holes: read block by block


def _chunk_bounds(pattern: _Pattern, pos: Tensor, q_offset: int, lo: Tensor, hi: Tensor):
    """Row bounds (B|1, N) narrowed to each query's chunk. A query at position P (its absolute
    position, or its position within its document when remapped) sees the keys of its chunk,
    which starts (P - left) mod c keys before it: transformers' floor division, as a floor
    remainder."""
    size, left = pattern.chunk
    at = pattern.positions if pattern.positions is not None else pos - pos[0] + q_offset
    at = at.to(pos.device)
    back = torch.remainder(at.reshape(-1, pos.shape[0]) - left.to(pos.device)[:, None], size)
    start = pos - back  # (B, N), key index of the chunk's first key
    return torch.maximum(lo, start), torch.minimum(hi, start + size)


@dataclass
class _Built:
    """The arguments `_structured` built a description from."""

    pattern: _Pattern
    n: int
    s: int
    offset: int
    q_offset: int
    padding: Tensor | None
    device: Any


def _structured(
    pattern: _Pattern, n: int, s: int, offset: int, q_offset: int, padding: Tensor | None, device
) -> StructuredMask:
    """The row-interval mask of `pattern` for N queries at key positions i + offset."""
    built = _Built(pattern, n, s, offset, q_offset, padding, device)
    pos = torch.arange(n, device=device) + offset  # (N,)
    lo = pos + pattern.lo if pattern.lo is not None else torch.zeros_like(pos)
    hi = pos + pattern.hi if pattern.hi is not None else torch.full_like(pos, s)
    keys = f"p{pattern.lo:+d}" if pattern.lo is not None else "0"
    keys += f" <= j < p{pattern.hi:+d}" if pattern.hi is not None else " <= j"
    if pattern.chunk is not None:
        lo, hi = _chunk_bounds(pattern, pos, q_offset, lo, hi)
        keys += f", chunks of {pattern.chunk[0]}"
    mask: StructuredMask = RowIntervals(lo, hi, s, f"transformers({keys})")
    if pattern.docs is not None:
        mask = mask & document(pattern.docs.to(device))
    if padding is not None:
        mask = mask & _key_padding(padding.to(device), n)
    _BUILT[mask] = built
    return mask


def layer_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function=mu.causal_mask_function,
    attention_mask: Tensor | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    **kwargs: Any,
) -> Tensor | StructuredMask | None:
    """The mask transformers builds for an attnkit layer (its ``AttentionMaskInterface``).

    Returns, for a pattern it reads (see the module docstring):

    * None: nothing masked — a bidirectional layer without padding, or a causal one whose
      last query is the last key (the attention call passes ``causal=True``);
    * the padding alone, (B, 1, 1, S) booleans, for that causal layer with padding;
    * the padding as a stride-0 view (B, 1, N, S) of (B, 1, 1, S) for a bidirectional layer
      (no N x S memory; the attention call reads it as key padding without causality);
    * a `StructuredMask` (row intervals, & documents, & padding) for windows, packed
      documents and caches with offsets;

    and for any other pattern transformers' own dense (B, 1, N, S) boolean mask.
    """
    pattern = _Pattern()
    offsets = isinstance(q_offset, int) and isinstance(kv_offset, int)
    known = offsets and not torch.compiler.is_compiling() and _known(mask_function, pattern)
    remapped = pattern.positions is not None
    if known and remapped and (pattern.docs is None or q_offset or kv_offset):
        known = False
    # A model that asks for a materialised mask (allow_*_skip=False: it concatenates it with
    # another one) gets one; transformers itself turns the causal skip off for packing only.
    asked = not allow_is_causal_skip if pattern.causal else not allow_is_bidirectional_skip
    if not known or q_length == 1 or (asked and pattern.docs is None):
        return _dense(
            batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
            attention_mask, allow_is_bidirectional_skip, kwargs,
        )  # fmt: skip
    padding = _padding(attention_mask, kv_length, kv_offset)
    offset = q_offset - kv_offset  # query i sits at key position i + offset
    plain = pattern.lo is None and pattern.docs is None and pattern.chunk is None
    if plain and pattern.causal and offset == kv_length - q_length:
        return None if padding is None else padding[:, None, None, :]  # (B, 1, 1, S)
    if plain and not pattern.causal and pattern.hi is None:
        if padding is None:
            return None
        return padding[:, None, None, :].expand(-1, 1, q_length, -1)  # (B, 1, N, S), a view
    device = kwargs.get("device") or (attention_mask.device if attention_mask is not None else None)
    return _structured(pattern, q_length, kv_length, offset, q_offset, padding, device)


def _dense(batch_size, q_length, kv_length, q_offset, kv_offset, fn, attention_mask, bidi, kw):
    """transformers' own boolean (B, 1, N, S) mask of `fn` (or None where it needs none)."""
    return mu.sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=fn,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,  # the full pattern: its alignment may not be bottom-right
        allow_is_bidirectional_skip=bidi,
        **{k: v for k, v in kw.items() if k in ("use_vmap", "device", "local_size")},
    )


def is_padded(mask: StructuredMask) -> bool:
    """True for a mask `layer_mask` built with key padding in it."""
    built = _BUILT.get(mask)
    return built is not None and built.padding is not None


def with_documents(mask: StructuredMask, ids: Tensor) -> StructuredMask:
    """`mask` for a packed row whose document ids (B|1, N) the attention call found: a
    description `layer_mask` built (no cache) is rebuilt with each document's own positions,
    so chunks (Llama 4) restart at every document as they do for the document alone; any
    other mask gets ``& document(ids)``."""
    built = _BUILT.get(mask)
    if built is None or built.offset or built.q_offset or built.pattern.positions is not None:
        return mask & document(ids)
    n = ids.shape[-1]
    index = torch.arange(n, device=ids.device).expand_as(ids)  # (B|1, N)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    first = torch.where(starts, index, 0).cummax(1).values  # each token's document start
    pattern = replace(built.pattern, docs=ids, positions=index - first)
    return _structured(pattern, n, built.s, 0, 0, built.padding, built.device)


# --------------------------------------------------------------------------- packed documents


def documents(kwargs: dict[str, Any], batch: int, n: int, s: int) -> Tensor | None:
    """Document ids (B|1, N) of a packed batch, from what the model passed to the attention
    call; None when it is not packed (or has a key/value cache: N != S).

    * ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (flash-attention's varlen arguments): the
      documents' boundaries in one flattened row (B = 1), equal for queries and keys;
    * otherwise ``position_ids`` (B|1, N) that restart: a new document wherever a position is
      not the one before plus 1 (transformers' ``find_packed_sequence_indices``).
    """
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None or cu_k is not None:
        return _from_cu_seq_lens(cu_q, cu_k, batch, n, s)
    pos = kwargs.get("position_ids")
    if not isinstance(pos, Tensor) or pos.dim() != 2 or pos.shape[-1] != n or n != s or n < 2:
        return None
    if pos.dtype.is_floating_point or pos.shape[0] not in (1, batch):
        return None
    step = torch.diff(pos, dim=-1)  # (B|1, N - 1)
    ids = torch.nn.functional.pad((step != 1).long().cumsum(-1), (1, 0))  # (B|1, N)
    if not tracing() and not bool(ids[:, -1].any()):
        return None  # one document per row: nothing to separate
    return ids


def _from_cu_seq_lens(cu_q, cu_k, batch: int, n: int, s: int) -> Tensor:
    for name, cu in (("cu_seq_lens_q", cu_q), ("cu_seq_lens_k", cu_k)):
        if not isinstance(cu, Tensor) or cu.dim() != 1 or cu.dtype.is_floating_point:
            got = f"{cu.dtype} {tuple(cu.shape)}" if isinstance(cu, Tensor) else repr(cu)
            raise ValueError(
                f"attn_implementation='attnkit': {name} must be an integer tensor (D + 1,) "
                f"of cumulative document lengths, got {got}"
            )
    if not torch.equal(cu_q.cpu(), cu_k.cpu()) or n != s:
        raise ValueError(
            "attn_implementation='attnkit': cu_seq_lens_q and cu_seq_lens_k must be equal "
            f"(packed self-attention, N = S), got {cu_q.tolist()} and {cu_k.tolist()} for "
            f"N={n}, S={s}"
        )
    lengths = torch.diff(cu_q.long())
    if batch != 1 or int(cu_q[0]) != 0 or bool((lengths < 0).any()) or int(cu_q[-1]) > n:
        raise ValueError(
            "attn_implementation='attnkit': cu_seq_lens_q must rise from 0 to at most the "
            f"sequence length {n} of one flattened row (B = 1), got {cu_q.tolist()} with "
            f"B={batch}"
        )
    return document_ids(lengths, total=n).to(cu_q.device)[None]  # (1, N)
