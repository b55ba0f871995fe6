"""ViT, T2T-ViT and a small CNN with CBAM, from attnkit modules; configs and named presets.

Dimensions: B batch, Ci image channels, I image side, P patch side,
h × w token grid, N = h·w tokens (+1 with a class token), C width, K classes.

ViT: Dosovitskiy et al. 2021. T2T-ViT: Yuan et al. 2021 (tokens-to-token:
soft split with overlap -> token transformer -> reshape to a grid, repeated).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.functional.positional import sincos_2d
from attnkit.models.checkpoint import config_from_fields
from attnkit.modules._checks import (
    check_image,
    nonnegative_int,
    positive_int,
    positive_number,
    probability,
)
from attnkit.modules.blocks import EncoderBlock, FeedForward, PreNormResidual
from attnkit.modules.classic import T2TAttention
from attnkit.modules.embed import LearnedPositionalEmbedding, PatchEmbed
from attnkit.vision.spatial import CBAM

__all__ = [
    "PRESETS",
    "CNNConfig",
    "PatchEmbed",
    "SmallCNN",
    "T2TEmbed",
    "ViT",
    "ViTConfig",
    "build_model",
    "config_from_dict",
]


class T2TEmbed(nn.Module):
    """Tokens-to-token embedding (Yuan et al. 2021, §3.1): (B, Ci, I, I) -> (B, N, C).

    For each (kernel k, stride s) in `splits` but the last: soft split (an
    overlapping nn.Unfold with padding k//2, tokens of width c·k²), then a token
    transformer — T2TAttention (width c·k² -> `chan`, skip through V) and a
    pre-norm feed-forward — then reshape back to a (chan, h, w) map. The last
    soft split is projected to C by a Linear. `grid` is the final (h, w).
    `device`, `dtype`: of the parameters.
    """

    def __init__(
        self,
        image_size: int,
        in_chans: int,
        dim: int,
        splits: tuple[tuple[int, int], ...],
        chan: int,
        mlp_ratio: float = 1.0,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        splits = _splits("splits", splits)
        image_size = positive_int("image_size", image_size)
        in_chans = positive_int("in_chans", in_chans)
        dim, chan = positive_int("dim", dim), positive_int("chan", chan)
        positive_number("mlp_ratio", mlp_ratio)
        self.image_size, self.in_chans = image_size, in_chans
        self.unfolds = nn.ModuleList(nn.Unfold(k, padding=k // 2, stride=s) for k, s in splits)
        self.stages = nn.ModuleList()  # one token transformer per split but the last
        self.sides: list[int] = []
        side, width = image_size, in_chans
        for i, (k, s) in enumerate(splits):
            side = (side + 2 * (k // 2) - k) // s + 1
            self.sides.append(side)
            if i < len(splits) - 1:
                ff = PreNormResidual(
                    FeedForward(chan, int(chan * mlp_ratio), **fk), nn.LayerNorm(chan, **fk)
                )
                stage = nn.Sequential(
                    nn.LayerNorm(width * k * k, **fk), T2TAttention(width * k * k, chan, **fk), ff
                )
                self.stages.append(stage)
                width = chan
        self.grid = (side, side)
        self.proj = nn.Linear(width * splits[-1][0] ** 2, dim, **fk)

    def forward(self, x: Tensor) -> Tensor:
        """(B, Ci, I, I) -> (B, N, C)."""
        check_image(x, self.in_chans, self.image_size, "T2TEmbed")
        for unfold, stage, side in zip(self.unfolds, self.stages, self.sides, strict=False):
            tokens = unfold(x).transpose(1, 2)  # (B, c·k², h·w) -> (B, h·w, c·k²)
            tokens = stage(tokens)  # (B, h·w, chan)
            x = tokens.transpose(1, 2).unflatten(2, (side, side))  # (B, chan, h, w)
        return self.proj(self.unfolds[-1](x).transpose(1, 2))  # (B, N, c·k²) -> (B, N, C)


@dataclass(frozen=True)
class ViTConfig:
    """A ViT or T2T-ViT classifier."""

    image_size: int = 8  # I, square images
    in_chans: int = 1  # Ci
    num_classes: int = 10  # K
    tokens: str = "patch"  # "patch" (PatchEmbed) or "t2t" (T2TEmbed)
    patch_size: int = 2  # P, tokens="patch": N = (I/P)² tokens
    t2t_splits: tuple[tuple[int, int], ...] = ((3, 1), (3, 2), (3, 1))  # (kernel, stride), t2t
    t2t_chan: int = 32  # token-transformer width, tokens="t2t"
    dim: int = 64  # C
    depth: int = 2  # encoder blocks
    num_heads: int = 4  # H
    mlp_ratio: float = 4.0  # feed-forward hidden width F = C·mlp_ratio
    pool: str = "cls"  # "cls" (class token) or "mean" (mean of the patch tokens)
    pos: str = "sincos"  # fixed 2-D sin-cos, or a "learned" table
    dropout: float = 0.0  # on sublayer outputs
    attn_dropout: float = 0.0  # on attention probabilities
    # Options that Hugging Face's ViT uses (attnkit.convert.hf_vision loads it exactly):
    norm_eps: float = 1e-5  # LayerNorm epsilon (HF ViT: 1e-12)
    qkv_bias: bool = True  # biases of the q, k, v projections
    cls_pos: bool = False  # the class token has a position too: one (1 + N, C) table
    pooler: bool = False  # tanh(Linear(C, C)) on the pooled token before the head (HF, BERT)

    def __post_init__(self) -> None:
        for name in ("image_size", "in_chans", "patch_size", "t2t_chan", "dim", "depth"):
            positive_int(name, getattr(self, name))
        positive_int("num_heads", self.num_heads)
        nonnegative_int("num_classes", self.num_classes)  # 0: no head
        positive_number("mlp_ratio", self.mlp_ratio)
        probability("dropout", self.dropout)
        probability("attn_dropout", self.attn_dropout)
        _splits("t2t_splits", self.t2t_splits)


@dataclass(frozen=True)
class CNNConfig:
    """A small CNN with CBAM after every convolution stage."""

    image_size: int = 8  # I
    in_chans: int = 1  # Ci
    num_classes: int = 10  # K
    widths: tuple[int, ...] = (32, 64)  # channels per stage; 2×2 max-pool between stages
    reduction: int = 8  # CBAM channel reduction r
    kernel_size: int = 3  # CBAM spatial kernel (odd; small maps want small kernels)

    def __post_init__(self) -> None:
        for name in ("image_size", "in_chans", "num_classes", "reduction", "kernel_size"):
            positive_int(name, getattr(self, name))
        if not self.widths:
            raise ValueError("widths must hold at least one stage width, got ()")
        for i, w in enumerate(self.widths):
            positive_int(f"widths[{i}]", w)


class ViT(nn.Module):
    """Vision Transformer classifier: tokens -> (+ positions) -> pre-norm encoder -> head.

    images (B, Ci, I, I) -> logits (B, K). Positions are added to the patch
    tokens only; the class token (pool="cls") is prepended after. The encoder
    blocks are `blocks.{i}` (record their attention with
    `record_attention(model)`; maps (B, H, N', N') with N' = N + 1 for "cls").
    `device`, `dtype`: of the parameters, as for `torch.nn.Linear`.
    """

    def __init__(
        self,
        config: ViTConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        c, fk = config, {"device": device, "dtype": dtype}
        _choice("pool", c.pool, ("cls", "mean"))
        _choice("pos", c.pos, ("learned", "sincos"))
        _choice("tokens", c.tokens, ("patch", "t2t"))
        self.config = c
        if c.tokens == "patch":
            self.embed: nn.Module = PatchEmbed(c.image_size, c.patch_size, c.in_chans, c.dim, **fk)
        else:
            self.embed = T2TEmbed(c.image_size, c.in_chans, c.dim, c.t2t_splits, c.t2t_chan, **fk)
        self.grid: tuple[int, int] = self.embed.grid
        n = self.grid[0] * self.grid[1]
        if c.pos == "learned":
            self.pos: nn.Module = LearnedPositionalEmbedding(n, c.dim, **fk)
        else:
            self.pos = _FixedPositions(self.grid, c.dim, **fk)
        if c.cls_pos and (c.pool, c.pos) != ("cls", "learned"):
            raise ValueError(
                f"cls_pos=True needs pool='cls' and pos='learned', got {c.pool!r}, {c.pos!r}"
            )
        if c.cls_pos:
            self.pos = LearnedPositionalEmbedding(n + 1, c.dim, **fk)
        cls_token = nn.Parameter(torch.empty(1, 1, c.dim, **fk)) if c.pool == "cls" else None
        self.cls_token = cls_token
        hidden = int(c.dim * c.mlp_ratio)
        self.blocks = nn.ModuleList(
            EncoderBlock(
                c.dim,
                c.num_heads,
                hidden,
                dropout=c.dropout,
                attn_dropout=c.attn_dropout,
                norm_eps=c.norm_eps,
                qkv_bias=c.qkv_bias,
                **fk,
            )
            for _ in range(c.depth)
        )
        self.norm = nn.LayerNorm(c.dim, eps=c.norm_eps, **fk)
        dense = nn.Linear(c.dim, c.dim, **fk) if c.pooler else None
        self.pooler = nn.Sequential(dense, nn.Tanh()) if dense is not None else nn.Identity()
        # num_classes=0: no head, forward returns the pooled features (B, C)
        self.head = nn.Linear(c.dim, c.num_classes, **fk) if c.num_classes else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The class token starts at 0 (submodules reset their own parameters)."""
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)

    @property
    def class_token(self) -> bool:
        return self.cls_token is not None

    def features(self, images: Tensor) -> Tensor:
        """(B, Ci, I, I) -> the normalised tokens (B, N', C) (HF: last_hidden_state)."""
        x = self.embed(images)  # (B, N, C)
        if not self.config.cls_pos:
            x = self.pos(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1)  # (B, 1 + N, C)
        if self.config.cls_pos:
            x = self.pos(x)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, images: Tensor) -> Tensor:
        """(B, Ci, I, I) -> logits (B, K) (num_classes=0: pooled features (B, C))."""
        x = self.features(images)
        x = x[:, 0] if self.cls_token is not None else x.mean(1)  # (B, C)
        return self.head(self.pooler(x))


class _FixedPositions(nn.Module):
    """x + the 2-D sin-cos table (N, C) of a grid: a non-persistent buffer (recomputed by
    `reset_parameters`, e.g. after `to_empty`; not saved)."""

    def __init__(self, grid: tuple[int, int], dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.grid, self.dim = grid, dim
        dtype = torch.get_default_dtype() if dtype is None else dtype
        table = torch.empty(grid[0] * grid[1], dim, device=device, dtype=dtype)
        self.register_buffer("table", table, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        t = self.table
        t.copy_(sincos_2d(*self.grid, self.dim, dtype=t.dtype, device=t.device))

    def forward(self, x: Tensor) -> Tensor:
        """(B, N, C) -> (B, N, C)."""
        return x + self.table.to(x.dtype)


class SmallCNN(nn.Module):
    """[Conv3×3 -> BatchNorm -> ReLU -> CBAM] per stage, 2×2 max-pool between stages,
    global average pool, Linear. images (B, Ci, I, I) -> logits (B, K).
    `device`, `dtype`: of the parameters and BatchNorm statistics."""

    def __init__(
        self,
        config: CNNConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.config = config
        layers: list[nn.Module] = []
        width = config.in_chans
        for i, out in enumerate(config.widths):
            if i:
                layers.append(nn.MaxPool2d(2))
            layers += [
                nn.Conv2d(width, out, 3, padding=1, bias=False, **fk),
                nn.BatchNorm2d(out, **fk),
                nn.ReLU(inplace=True),
                CBAM(out, config.reduction, config.kernel_size, **fk),
            ]
            width = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(width, config.num_classes, **fk)

    def forward(self, images: Tensor) -> Tensor:
        """(B, Ci, I, I) -> logits (B, K)."""
        c = self.config
        check_image(images, c.in_chans, c.image_size, "SmallCNN")
        return self.head(self.features(images).mean((2, 3)))


def _splits(name: str, splits) -> tuple[tuple[int, int], ...]:
    """(kernel, stride) pairs of positive integers, at least one."""
    if not splits:
        raise ValueError(f"{name} must hold at least one (kernel, stride) pair, got ()")
    for i, pair in enumerate(splits):
        if len(pair) != 2:
            raise ValueError(f"{name}[{i}] must be a (kernel, stride) pair, got {pair!r}")
        positive_int(f"{name}[{i}] kernel", pair[0])
        positive_int(f"{name}[{i}] stride", pair[1])
    return tuple(tuple(p) for p in splits)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


PRESETS: dict[str, ViTConfig | CNNConfig] = {
    # 16 tokens of 2 × 2 pixels + a class token, width 64, 2 pre-norm blocks, 2-D sin-cos
    # positions, no dropout (on 1,437 images shift augmentation regularises better; see
    # docs/en/results/vision.md for the settings tried)
    "vit": ViTConfig(),
    # the same with mean pooling over the patch tokens instead of a class token
    "vit-mean": ViTConfig(pool="mean"),
    # soft splits 8×8 (k3 s1) -> 4×4 (k3 s2) -> 16 tokens (k3 s1), then the "vit" backbone
    "t2t": ViTConfig(tokens="t2t"),
    "cnn": CNNConfig(),
}


def build_model(config: ViTConfig | CNNConfig, *, device=None, dtype=None) -> nn.Module:
    """The model a config describes, with its parameters on `device` in `dtype`."""
    if isinstance(config, ViTConfig):
        return ViT(config, device=device, dtype=dtype)
    if isinstance(config, CNNConfig):
        return SmallCNN(config, device=device, dtype=dtype)
    raise ValueError(f"config must be a ViTConfig or CNNConfig, got {type(config).__name__}")


def config_from_dict(kind: str, fields: dict) -> ViTConfig | CNNConfig:
    """Inverse of `dataclasses.asdict` for a saved config (`kind`: "ViTConfig" or "CNNConfig")."""
    cls = {"ViTConfig": ViTConfig, "CNNConfig": CNNConfig}.get(kind)
    if cls is None:
        raise ValueError(f"config kind must be 'ViTConfig' or 'CNNConfig', got {kind!r}")
    # JSON turns tuples into lists; dataclass fields here that are sequences are tuples
    return config_from_fields(cls, {k: _tuples(v) for k, v in fields.items()})


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v
