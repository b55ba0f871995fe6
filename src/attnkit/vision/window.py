"""Swin Transformer window attention (Liu et al. 2021): windows, cyclic shift, relative bias.

Dimensions: B batch, H × W token grid, C width, M window side, s shift,
nW windows per image, Hh heads, Dh head width. Maps are channels-last (B, H, W, C).

Grids that are not multiples of M are padded at the bottom/right to Hp × Wp
(multiples of M); padded tokens are masked out as keys, so the output on the
real tokens does not depend on the padding, and they are cropped away after.
`pad_attends=True` lets the zero padding tokens be attended to instead, as the
reference Swin and Hugging Face's SwinLayer do (their keys/values are the
projection biases); it exists to reproduce those numbers exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.functional import score_mods
from attnkit.modules._checks import positive_int, positive_number, probability
from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.blocks import EncoderBlock

__all__ = [
    "SwinBlock",
    "WindowAttention",
    "relative_position_index",
    "window_mask",
    "window_partition",
    "window_reverse",
]


def window_partition(x: Tensor, window_size: int) -> Tensor:
    """(B, H, W, C) -> (B·nW, M·M, C), windows in row-major order per image.

    H and W must be multiples of M (`WindowAttention` pads first).
    """
    if x.dim() != 4:
        raise ValueError(f"window_partition: x must have shape (B, H, W, C), got {tuple(x.shape)}")
    b, h, w, c = x.shape
    m = window_size
    if h % m or w % m:
        raise ValueError(
            f"window_partition: grid {h}×{w} must be a multiple of window_size={m}; "
            "pad it first (WindowAttention does)"
        )
    x = x.view(b, h // m, m, w // m, m, c)  # (B, H/M, M, W/M, M, C)
    return x.transpose(2, 3).reshape(-1, m * m, c)  # (B·nW, M·M, C)


def window_reverse(windows: Tensor, window_size: int, h: int, w: int) -> Tensor:
    """(B·nW, M·M, C) -> (B, H, W, C); the inverse of `window_partition`."""
    m = window_size
    if windows.dim() != 3 or windows.shape[1] != m * m or h % m or w % m:
        raise ValueError(
            f"window_reverse: windows must have shape (B·nW, {m * m}, C) for a grid that is a "
            f"multiple of {m}, got {tuple(windows.shape)} for grid {h}×{w}"
        )
    c = windows.shape[-1]
    x = windows.view(-1, h // m, w // m, m, m, c)  # (B, H/M, W/M, M, M, C)
    return x.transpose(2, 3).reshape(-1, h, w, c)  # (B, H, W, C)


def relative_position_index(window_size: int, device: torch.device | str | None = None) -> Tensor:
    """(M², M²) long, on `device`: index into the (2M-1)² bias table of Swin (Liu et al. 2021,
    §3.2).

    Token i at (yi, xi) and j at (yj, xj) of a window read entry
    (yi - yj + M - 1) · (2M - 1) + (xi - xj + M - 1).
    """
    m = window_size
    r = torch.arange(m, device=device)
    yx = torch.stack(torch.meshgrid(r, r, indexing="ij"))  # (2, M, M)
    yx = yx.flatten(1)  # (2, M²)
    rel = yx[:, :, None] - yx[:, None, :] + (m - 1)  # (2, M², M²), each in [0, 2M-2]
    return rel[0] * (2 * m - 1) + rel[1]


def _padded(n: int, m: int) -> int:
    return -(-n // m) * m


def window_mask(
    h: int,
    w: int,
    window_size: int,
    shift: int,
    device: torch.device | str | None = None,
    *,
    mask_padding: bool = True,
) -> Tensor | None:
    """Boolean "may attend" mask per window, (nW, M², M²), or None when nothing is masked.

    The grid h × w is padded to Hp × Wp and rolled by (-shift, -shift). In the
    rolled grid the bottom/right bands hold tokens from the opposite edge, so
    Swin labels three regions per axis (slices [0, Hp-M), [Hp-M, Hp-s),
    [Hp-s, Hp)) and a token may attend only to keys with the same label. Padded
    keys are blocked too unless `mask_padding=False`.
    """
    m, s = window_size, shift
    hp, wp = _padded(h, m), _padded(w, m)
    if s == 0 and ((hp, wp) == (h, w) or not mask_padding):
        return None
    labels = torch.zeros(hp, wp, dtype=torch.long, device=device)
    if s:
        bands = (slice(0, -m), slice(-m, -s), slice(-s, None))
        for i, rows in enumerate(bands):
            for j, cols in enumerate(bands):
                labels[rows, cols] = 3 * i + j
    valid = torch.zeros(hp, wp, dtype=torch.bool, device=device)
    valid[:h, :w] = True
    valid |= not mask_padding
    valid = torch.roll(valid, (-s, -s), dims=(0, 1))  # padding moves with the shift
    labels = window_partition(labels[None, :, :, None], m)[..., 0]  # (nW, M²)
    valid = window_partition(valid[None, :, :, None], m)[..., 0]  # (nW, M²)
    return (labels[:, :, None] == labels[:, None, :]) & valid[:, None, :]  # (nW, M², M²)


class WindowAttention(nn.Module):
    """(Shifted-)window multi-head self-attention with relative position bias.

    Args:
        dim: C.
        num_heads: Hh.
        window_size: M; attention runs inside non-overlapping M × M windows.
        shift: s in [0, M); s > 0 rolls the grid by (-s, -s) first (SW-MSA) and
            masks pairs that were not neighbours before the roll.
        qkv_bias, attn_dropout: as in `MultiHeadAttention`.
        pad_attends: padding tokens (grids not a multiple of M) may be attended
            to, as in the reference Swin / Hugging Face; default: masked out.
        device, dtype: of the parameters (`index` is a long buffer on `device`).

    Parameters: `attn` (a `MultiHeadAttention`, whose `Attend` is what
    `record_attention` sees: maps (B·nW, Hh, M², M²)) and `bias_table`
    ((2M-1)², Hh), initialised with std 0.02.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window_size: int,
        *,
        shift: int = 0,
        qkv_bias: bool = True,
        attn_dropout: float = 0.0,
        pad_attends: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        window_size = positive_int("window_size", window_size)
        if isinstance(shift, bool) or not isinstance(shift, int) or not 0 <= shift < window_size:
            raise ValueError(
                f"shift must be an integer in [0, window_size={window_size}), got {shift!r}"
            )
        self.window_size, self.shift, self.pad_attends = window_size, shift, pad_attends
        attn_dropout = probability("attn_dropout", attn_dropout)
        self.attn = MultiHeadAttention(
            dim, num_heads, qkv_bias=qkv_bias, dropout=attn_dropout, **fk
        )
        self.bias_table = nn.Parameter(torch.empty((2 * window_size - 1) ** 2, num_heads, **fk))
        # Non-persistent: recomputed by reset_parameters (after `to_empty`), not saved.
        m2 = window_size**2
        index = torch.empty(m2, m2, dtype=torch.long, device=device)
        self.register_buffer("index", index, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """bias_table ~ N(0, 0.02²); `index` recomputed (`attn` resets itself)."""
        nn.init.normal_(self.bias_table, std=0.02)
        self.index.copy_(relative_position_index(self.window_size, self.index.device))

    def relative_bias(self) -> Tensor:
        """(Hh, M², M²) additive scores, the same for every window (what `forward` adds, as
        the score function ``relative_bias(bias_table, window_offsets(M))``)."""
        m2 = self.window_size**2
        return self.bias_table[self.index.flatten()].view(m2, m2, -1).permute(2, 0, 1)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """x (B, H, W, C) -> (B, H, W, C).

        `mask` and `causal` exist so the module can stand in `EncoderBlock`;
        window attention defines its own mask and refuses both.
        """
        if mask is not None or causal:
            raise ValueError("WindowAttention builds its own mask; got mask= or causal=True")
        if x.dim() != 4 or x.shape[-1] != self.attn.dim:
            raise ValueError(
                f"WindowAttention: x must have shape (B, H, W, {self.attn.dim}), "
                f"got {tuple(x.shape)}"
            )
        b, h, w, _ = x.shape
        m, s = self.window_size, self.shift
        hp, wp = _padded(h, m), _padded(w, m)
        x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))  # (B, Hp, Wp, C)
        if s:
            x = torch.roll(x, (-s, -s), dims=(1, 2))
        windows = window_partition(x, m)  # (B·nW, M², C)
        # (nW, M², M²) or None
        allowed = window_mask(h, w, m, s, x.device, mask_padding=not self.pad_attends)
        if allowed is not None:
            allowed = allowed.repeat(b, 1, 1).unsqueeze(1)  # (B·nW, 1, M², M²)
        q, k, v = self.attn.heads_qkv(windows)  # (B·nW, Hh, M², Dh) each
        # the table read at each score (kernels compute the index, never a (Hh, M², M²) bias)
        rel = score_mods.relative_bias(self.bias_table, score_mods.window_offsets(m))
        o = self.attn.attend(q, k, v, mask=allowed, score_mod=rel).out
        windows = self.attn.proj(self.attn.merge_heads(o))  # (B·nW, M², C)
        x = window_reverse(windows, m, hp, wp)  # (B, Hp, Wp, C)
        if s:
            x = torch.roll(x, (s, s), dims=(1, 2))
        return x[:, :h, :w]

    def extra_repr(self) -> str:
        return f"window_size={self.window_size}, shift={self.shift}, pad_attends={self.pad_attends}"


class SwinBlock(EncoderBlock):
    """A Swin Transformer block: pre-norm (S)W-MSA then pre-norm MLP, each residual.

    x (B, H, W, C) -> (B, H, W, C). Alternate `shift=0` and `shift=M // 2`
    blocks as in the paper (Liu et al. 2021, Fig. 3b). `pad_attends`, `qkv_bias`:
    see `WindowAttention`; `activation`, `norm_eps`: see `EncoderBlock`.
    `device`, `dtype`: of the parameters.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window_size: int = 7,
        *,
        shift: int = 0,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        pad_attends: bool = False,
        qkv_bias: bool = True,
        activation: str | nn.Module = "gelu",
        norm_eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        fk = {"device": device, "dtype": dtype}
        positive_int("dim", dim)
        positive_number("mlp_ratio", mlp_ratio)
        attn = WindowAttention(
            dim,
            num_heads,
            window_size,
            shift=shift,
            qkv_bias=qkv_bias,
            attn_dropout=attn_dropout,
            pad_attends=pad_attends,
            **fk,
        )
        super().__init__(
            dim,
            num_heads,
            int(dim * mlp_ratio),
            dropout=dropout,
            activation=activation,
            norm_eps=norm_eps,
            attn=attn,
            **fk,
        )
