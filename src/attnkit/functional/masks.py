"""Attention masks: one convention, and converters from the ones users bring.

attnkit's convention, everywhere: a **boolean mask is True where a query may
attend to a key** (the polarity of `torch.nn.functional.scaled_dot_product_attention`),
broadcastable to `(B, H, N, S)`. A floating tensor is never a mask: it is an
additive *bias*. Masks are applied with `where`, never by adding a large
literal such as -1e9 (which overflows in float16 and leaks weight in float32).

Dimensions: B batch, H heads, N query length, S key length.

Every constructor and converter here returns a 4-D mask `(B or 1, H or 1, N or 1, S)`, so no
batch size can be mistaken for a sequence length when it broadcasts (`attention` refuses a
2-D or 3-D mask whose leading size equals the batch: that refusal is for masks users build
themselves). `from_zero_blocked` keeps the shape it is given.

Causal masks with N != S are aligned bottom-right: query i sees keys
j <= i + (S - N). That is what decoding with a key/value cache needs (the last
query is the newest token and sees every cached key).

Structured masks (`window`, `document`, `prefix`, `from_function`, `dilated_window`,
`strided`, `neighborhood_2d`, `reorder`, and their `&` / `|` with each other and with boolean
tensors) describe themselves instead of holding an (N, S)
tensor: kernels skip the blocks they hide. See `attnkit.functional.structured`.
`from_block_mask` reads FlexAttention's `BlockMask` as one, `to_block_mask` writes one as a
`BlockMask` (`attnkit.functional.flex_masks`).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from attnkit.functional.flex_masks import from_block_mask, to_block_mask
from attnkit.functional.reordered import dilated_window, neighborhood_2d, reorder, strided
from attnkit.functional.structured import (
    StructuredMask,
    document,
    document_ids,
    from_function,
    prefix,
    window,
)
from attnkit.functional.structured import window as _window

__all__ = [
    "StructuredMask",
    "causal",
    "combine",
    "dilated_window",
    "document",
    "document_ids",
    "from_block_mask",
    "from_function",
    "from_hf_attention_mask",
    "from_keras_attention_mask",
    "from_torch_attn_mask",
    "from_torch_key_padding_mask",
    "from_zero_blocked",
    "neighborhood_2d",
    "padding",
    "prefix",
    "reorder",
    "sliding_window",
    "strided",
    "to_block_mask",
    "window",
]


# sliding_window warns above this many bytes (N·S): 64 MiB, N = S = 8192
DENSE_WARN_BYTES = 2**26


def _shape(t: Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def causal(n: int, s: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """Causal mask `(1, 1, N, S)`, True where key j <= i + (S - N) (bottom-right aligned).

    With `s=None`, S = N. When N > S the first N - S queries see no key at all;
    attention gives those rows output 0.
    """
    s = n if s is None else s
    if n < 0 or s < 0:
        raise ValueError(f"causal: sizes must be >= 0, got n={n}, s={s}")
    allowed = torch.ones(n, s, dtype=torch.bool, device=device).tril(diagonal=s - n)
    return allowed[None, None]  # (1, 1, N, S)


def padding(lengths: Tensor, s: int | None = None) -> Tensor:
    """Key-padding mask `(B, 1, 1, S)` from valid lengths `(B,)`: True for key j < lengths[b].

    `s` defaults to `lengths.max()`. ValueError if a length lies outside [0, s]; that check
    reads the lengths, so it runs in eager mode only (torch.export and torch.compile skip it).
    """
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ValueError(
            f"padding: lengths must be an integer tensor of shape (B,), "
            f"got {lengths.dtype} {_shape(lengths)}"
        )
    from attnkit.functional._trace import tracing

    s = int(lengths.max()) if s is None else s
    # The range check reads the lengths' values, which a tracer (torch.export with a dynamic
    # batch, torch.compile) cannot turn into a Python bool: it is eager-only. Traced, a length
    # below 0 gives an all-False row (output 0) and one above s an all-True row, never an
    # out-of-range read.
    if not tracing() and lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > s):
        raise ValueError(f"padding: lengths must lie in [0, {s}], got {lengths.tolist()}")
    keys = torch.arange(s, device=lengths.device)
    return (keys[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)


def sliding_window(
    n: int,
    window: int,
    s: int | None = None,
    *,
    causal: bool = False,
    device: torch.device | str | None = None,
) -> Tensor:
    """Local attention mask `(1, 1, N, S)`: query i sees keys within `window` positions.

    Positions are aligned bottom-right as for `causal` (query i sits at key
    position i + S - N). Without `causal`, keys with |j - pos(i)| < window are
    kept (2·window - 1 keys in the interior); with `causal`, only the `window`
    keys pos(i) - window < j <= pos(i). The dense form of `window(...)`, which kernels
    run without building this tensor: prefer `masks.window` (a description, O(N) memory,
    whose masked blocks kernels skip). Above `DENSE_WARN_BYTES` (N·S bytes) a UserWarning
    says how much memory the tensor takes and names `masks.window`.
    """
    if isinstance(window, int) and not isinstance(window, bool) and window < 1:
        raise ValueError(f"sliding_window: window must be >= 1, got {window}")
    described = _window(n, window, s, causal=causal, device=device)  # checks n, s, window
    size = described.n * described.s  # one byte per boolean
    if size > DENSE_WARN_BYTES:
        warnings.warn(
            f"masks.sliding_window builds a dense (N, S) = ({described.n}, {described.s}) "
            f"boolean tensor of {size / 2**20:,.0f} MiB; masks.window(n, window, s, "
            "causal=...) describes the same mask in O(N) memory and attention skips the "
            "blocks it hides",
            stacklevel=2,
        )
    return described.dense()


def combine(*masks: Tensor | StructuredMask | None) -> Tensor | StructuredMask | None:
    """Logical AND of boolean masks (broadcast); `None` entries mean "no restriction". With a
    structured mask among them the result is a structured mask (`&` of them all)."""
    result: Tensor | StructuredMask | None = None
    for i, m in enumerate(masks):
        if m is None:
            continue
        if not isinstance(m, StructuredMask) and m.dtype != torch.bool:
            raise ValueError(f"combine: mask {i} must be boolean, got {m.dtype} {_shape(m)}")
        result = m if result is None else result & m
    return result


def from_torch_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """`torch.nn.MultiheadAttention`'s key_padding_mask `(B, S)` → attnkit.

    torch's boolean convention is **True = ignore this key**; the result is a
    boolean `(B, 1, 1, S)` with True = may attend. A floating key_padding_mask
    is additive in torch; it is returned as a bias of shape `(B, 1, 1, S)`.
    """
    if key_padding_mask.dim() != 2:
        raise ValueError(f"key_padding_mask must have shape (B, S), got {_shape(key_padding_mask)}")
    if key_padding_mask.dtype == torch.bool:
        return ~key_padding_mask[:, None, None, :]
    return key_padding_mask[:, None, None, :]


def from_torch_attn_mask(attn_mask: Tensor, num_heads: int | None = None) -> Tensor:
    """`torch.nn.MultiheadAttention`'s attn_mask → attnkit mask or bias.

    torch accepts `(N, S)` or `(B·H, N, S)`; boolean **True = not allowed**,
    floating = additive. Returns a boolean mask (True = may attend) or a float
    bias, of shape `(1, 1, N, S)` or `(B, H, N, S)` (the 3-D form needs `num_heads`).
    """
    if attn_mask.dim() == 3:
        if num_heads is None:
            raise ValueError(
                f"attn_mask of shape {_shape(attn_mask)} is (B*H, N, S): pass num_heads to split it"
            )
        if attn_mask.shape[0] % num_heads:
            raise ValueError(
                f"attn_mask first dim {attn_mask.shape[0]} is not a multiple of "
                f"num_heads={num_heads}"
            )
        attn_mask = attn_mask.reshape(-1, num_heads, *attn_mask.shape[1:])  # (B, H, N, S)
    elif attn_mask.dim() != 2:
        raise ValueError(
            f"attn_mask must have shape (N, S) or (B*H, N, S), got {_shape(attn_mask)}"
        )
    else:
        attn_mask = attn_mask[None, None]  # (1, 1, N, S)
    return ~attn_mask if attn_mask.dtype == torch.bool else attn_mask


def from_hf_attention_mask(attention_mask: Tensor) -> Tensor:
    """Hugging Face attention_mask `(B, S)` with **1 = keep, 0 = padding** → `(B, 1, 1, S)` bool."""
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must have shape (B, S) (1 = keep), got {_shape(attention_mask)}"
        )
    return (attention_mask != 0)[:, None, None, :]


def from_keras_attention_mask(attention_mask: Tensor) -> Tensor:
    """Keras MultiHeadAttention attention_mask `(B, N, S)`, **1 = attend** → `(B, 1, N, S)`."""
    if attention_mask.dim() != 3:
        raise ValueError(
            f"attention_mask must have shape (B, N, S) (1 = attend), got {_shape(attention_mask)}"
        )
    return (attention_mask != 0)[:, None]


def from_zero_blocked(mask: Tensor) -> Tensor:
    """The "mask == 0 means blocked" convention (the Annotated Transformer's) → bool, same shape."""
    return mask != 0


def document_positions(ids: Tensor) -> Tensor:
    """Each token's position inside its own document, int64 of the shape of `ids` (N,) or (B, N).

    Token i's position is the number of earlier tokens (in its row) with its document id, so
    positions restart at 0 where each document starts — ids [0, 0, 0, 1, 1] give
    [0, 1, 2, 0, 1] — and a document's tokens are numbered 0, 1, 2, ... exactly as if it were
    alone (contiguous or not). These are the ``position_ids`` of a packed batch (transformers'
    `DataCollatorWithFlattening` makes the same); `document(ids)` is its mask. GPT and BERT use
    both when given ``document_ids``."""
    if not isinstance(ids, Tensor) or ids.dim() not in (1, 2) or ids.dtype.is_floating_point:
        got = f"{ids.dtype} {_shape(ids)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(
            f"document_positions: ids must be an integer tensor (N,) or (B, N), got {got}"
        )
    if ids.dtype == torch.bool:
        raise ValueError(f"document_positions: ids must be integers, got bool {_shape(ids)}")
    rows = ids[None] if ids.dim() == 1 else ids  # (B|1, N)
    order = torch.sort(rows, dim=1, stable=True).indices  # (B|1, N): each id's tokens in order
    grouped = rows.gather(1, order)  # (B|1, N), sorted
    index = torch.arange(rows.shape[1], device=ids.device).expand_as(rows)  # (B|1, N)
    starts = torch.ones_like(rows, dtype=torch.bool)
    starts[:, 1:] = grouped[:, 1:] != grouped[:, :-1]  # the first token of each id
    first = torch.where(starts, index, 0).cummax(1).values  # sorted index of its id's first
    out = torch.empty_like(index).scatter_(1, order, index - first)  # (B|1, N)
    return out[0] if ids.dim() == 1 else out


__all__ += ["document_positions"]  # appended with the helper (the list above is sorted)
