"""Swin Transformer stages and model (Liu et al. 2021) from attnkit's `SwinBlock`.

Dimensions: B batch, Ci image channels, I image side, P patch side, H × W
token grid, C width (doubles at each patch merging), M window side.
Maps between stages are channels-last (B, H, W, C).

The layout follows the reference Swin (and Hugging Face's `SwinModel`):
patch embedding (a P × P hard split and a Linear, equal to the stride-P conv)
-> LayerNorm -> [optional absolute positions] -> stages -> LayerNorm ->
[mean over tokens]. A stage is `depth` `SwinBlock`s alternating shift 0 and
M // 2, then (all stages but the last) `PatchMerging`.

Small grids: a stage whose grid has min(H, W) <= M uses windows of side
min(H, W) and no shift (the reference's rule; HF's
`SwinLayer.set_shift_and_window_size`). The bias table then has
(2·min(H, W) - 1)² rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.modules._checks import positive_int, positive_number, probability
from attnkit.modules.embed import PatchEmbed
from attnkit.vision.window import SwinBlock

__all__ = ["PatchMerging", "SwinConfig", "SwinModel", "SwinStage", "stage_window"]

# The reference Swin (and HF) use LayerNorm's default eps after the patch
# embedding and in patch merging, whatever `layer_norm_eps` says.
REFERENCE_EPS = 1e-5


def stage_window(grid: tuple[int, int], window_size: int) -> tuple[int, bool]:
    """(window side, whether odd blocks shift) for a stage on an H × W `grid`.

    min(H, W) <= M: windows of side min(H, W), no shift; otherwise (M, True).
    """
    side = min(grid)
    return (side, False) if side <= window_size else (window_size, True)


class PatchMerging(nn.Module):
    """2 × 2 neighbourhoods concatenated, normalised, projected: (B, H, W, C) -> (B, H', W', 2C).

    H' = ceil(H / 2), W' = ceil(W / 2): an odd grid is zero-padded at the
    bottom/right first (as the reference and HF do). The 4C features of the
    neighbourhood at (2i, 2j) are ordered x[2i, 2j], x[2i+1, 2j], x[2i, 2j+1],
    x[2i+1, 2j+1]; then LayerNorm(4C) and Linear(4C, 2C, bias=False).
    Parameters: `norm`, `reduction`. `device`, `dtype`: of the parameters.
    """

    def __init__(
        self,
        dim: int,
        *,
        norm_eps: float = REFERENCE_EPS,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.dim = dim = positive_int("dim", dim)
        self.norm = nn.LayerNorm(4 * dim, eps=norm_eps, **fk)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False, **fk)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[-1] != self.dim:
            raise ValueError(
                f"PatchMerging: x must have shape (B, H, W, {self.dim}), got {tuple(x.shape)}"
            )
        h, w = x.shape[1:3]
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))  # (B, 2H', 2W', C)
        x = torch.cat([x[:, r::2, c::2] for c in range(2) for r in range(2)], dim=-1)
        return self.reduction(self.norm(x))  # (B, H', W', 4C) -> (B, H', W', 2C)


class SwinStage(nn.Module):
    """`depth` SwinBlocks on an H × W `grid`, then optionally `PatchMerging`.

    x (B, H, W, C) -> (B, H, W, C), or (B, ceil(H/2), ceil(W/2), 2C) with
    `downsample=True`. Block i shifts by M // 2 when i is odd, unless
    min(H, W) <= M (then windows of side min(H, W) and no shift; see
    `stage_window`). Other keyword arguments go to every `SwinBlock`.
    Attributes: `grid`, `out_grid`, `window_size` (the effective M).
    `device`, `dtype`: of the parameters.
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        window_size: int,
        *,
        grid: tuple[int, int],
        downsample: bool = False,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        activation: str = "gelu",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm_eps: float = 1e-5,
        pad_attends: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        dim, depth = positive_int("dim", dim), positive_int("depth", depth)
        window_size = positive_int("window_size", window_size)
        grid = tuple(int(g) for g in grid)
        if len(grid) != 2 or min(grid) < 1:
            raise ValueError(f"SwinStage: grid must be (H, W) with H, W >= 1, got {grid!r}")
        m, shifts = stage_window(grid, window_size)
        self.grid, self.window_size = grid, m
        self.out_grid = ((grid[0] + 1) // 2, (grid[1] + 1) // 2) if downsample else grid
        self.blocks = nn.ModuleList(
            SwinBlock(
                dim,
                num_heads,
                m,
                shift=m // 2 if shifts and i % 2 else 0,
                mlp_ratio=mlp_ratio,
                dropout=dropout,
                attn_dropout=attn_dropout,
                pad_attends=pad_attends,
                qkv_bias=qkv_bias,
                activation=activation,
                norm_eps=norm_eps,
                **fk,
            )
            for i in range(depth)
        )
        self.downsample = PatchMerging(dim, **fk) if downsample else None

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or tuple(x.shape[1:3]) != self.grid:
            raise ValueError(
                f"SwinStage: x must have shape (B, {self.grid[0]}, {self.grid[1]}, C), "
                f"got {tuple(x.shape)}"
            )
        for block in self.blocks:
            x = block(x)
        return x if self.downsample is None else self.downsample(x)


@dataclass(frozen=True)
class SwinConfig:
    """A Swin model. Stage s has width embed_dim · 2^s, depths[s] blocks, num_heads[s] heads.

    `image_size` must be a multiple of `patch_size` (HF pads the image; attnkit
    refuses). `norm_eps` is for the blocks and the final LayerNorm (HF's
    `layer_norm_eps`); the embedding and merging norms use 1e-5 as HF does.
    `pool`: `SwinModel(x)` returns the mean token (B, C_last) instead of the
    tokens. `pad_attends`: see `attnkit.vision.WindowAttention` (True for HF's numbers).
    """

    image_size: int = 224
    patch_size: int = 4
    in_chans: int = 3
    embed_dim: int = 96
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 7
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    activation: str = "gelu"
    dropout: float = 0.0
    attn_dropout: float = 0.0
    norm_eps: float = 1e-5
    absolute_pos: bool = False
    pool: bool = True
    pad_attends: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "depths", tuple(self.depths))
        object.__setattr__(self, "num_heads", tuple(self.num_heads))
        for name in ("image_size", "patch_size", "in_chans", "embed_dim", "window_size"):
            positive_int(name, getattr(self, name))
        for name in ("depths", "num_heads"):
            for i, value in enumerate(getattr(self, name)):
                positive_int(f"{name}[{i}]", value)
        positive_number("mlp_ratio", self.mlp_ratio)
        probability("dropout", self.dropout)
        probability("attn_dropout", self.attn_dropout)
        if len(self.depths) != len(self.num_heads) or not self.depths:
            raise ValueError(
                f"SwinConfig: depths and num_heads must have the same non-zero length, "
                f"got {len(self.depths)} and {len(self.num_heads)}"
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                f"SwinConfig: patch_size must divide image_size={self.image_size}, "
                f"got patch_size={self.patch_size}"
            )
        for s, heads in enumerate(self.num_heads):
            if (self.embed_dim << s) % heads:
                raise ValueError(
                    f"SwinConfig: num_heads[{s}] must divide the stage width "
                    f"{self.embed_dim << s}, got {heads}"
                )

    @property
    def grids(self) -> list[tuple[int, int]]:
        """The input grid of each stage."""
        g = self.image_size // self.patch_size
        out = [(g, g)]
        for _ in self.depths[1:]:
            g = (g + 1) // 2
            out.append((g, g))
        return out

    @property
    def num_features(self) -> int:
        """Width of the last stage, C_last = embed_dim · 2^(stages - 1)."""
        return self.embed_dim << (len(self.depths) - 1)

    def replace(self, **changes) -> SwinConfig:
        return dataclasses.replace(self, **changes)


class SwinModel(nn.Module):
    """Swin Transformer: (B, Ci, I, I) -> (B, C_last) with `pool`, else (B, N_last, C_last).

    Parameters: `embed` (`attnkit.modules.embed.PatchEmbed`), `embed_norm`, `pos`
    ((1, N, C), only with `absolute_pos`), `stages` (`SwinStage`s), `norm`.
    `features(x)` is the normalised last-stage tokens (HF's
    `last_hidden_state`); `stage_maps(x)` the embedded map and every stage's
    output (HF's `hidden_states`, as (B, H, W, C) maps).
    `device`, `dtype`: of the parameters, as for `torch.nn.Linear`.
    """

    def __init__(
        self,
        config: SwinConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        cfg = self.config = config
        self.embed = PatchEmbed(cfg.image_size, cfg.patch_size, cfg.in_chans, cfg.embed_dim, **fk)
        self.embed_norm = nn.LayerNorm(cfg.embed_dim, eps=REFERENCE_EPS, **fk)
        n = self.embed.grid[0] * self.embed.grid[1]
        pos = nn.Parameter(torch.empty(1, n, cfg.embed_dim, **fk)) if cfg.absolute_pos else None
        self.pos = pos
        self.drop = nn.Dropout(cfg.dropout)
        last = len(cfg.depths) - 1
        self.stages = nn.ModuleList(
            SwinStage(
                cfg.embed_dim << s,
                depth,
                heads,
                cfg.window_size,
                grid=grid,
                downsample=s < last,
                mlp_ratio=cfg.mlp_ratio,
                qkv_bias=cfg.qkv_bias,
                activation=cfg.activation,
                dropout=cfg.dropout,
                attn_dropout=cfg.attn_dropout,
                norm_eps=cfg.norm_eps,
                pad_attends=cfg.pad_attends,
                **fk,
            )
            for s, (depth, heads, grid) in enumerate(
                zip(cfg.depths, cfg.num_heads, cfg.grids, strict=True)
            )
        )
        self.norm = nn.LayerNorm(cfg.num_features, eps=cfg.norm_eps, **fk)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Absolute positions ~ N(0, 0.02²) (submodules reset their own parameters)."""
        if self.pos is not None:
            nn.init.normal_(self.pos, std=0.02)

    def stage_maps(self, images: Tensor) -> list[Tensor]:
        """[embedded (B, H, W, C), output of stage 0, ..., of the last stage]; no final norm."""
        x = self.embed_norm(self.embed(images))  # (B, N, C)
        if self.pos is not None:
            x = x + self.pos
        maps = [self.drop(x).unflatten(1, self.embed.grid)]  # (B, H, W, C)
        for stage in self.stages:
            maps.append(stage(maps[-1]))
        return maps

    def features(self, images: Tensor) -> Tensor:
        """(B, Ci, I, I) -> (B, N_last, C_last), after the final LayerNorm."""
        return self.norm(self.stage_maps(images)[-1].flatten(1, 2))

    def forward(self, images: Tensor) -> Tensor:
        x = self.features(images)
        return x.mean(1) if self.config.pool else x
