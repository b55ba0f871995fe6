"""PNG pictures drawn with Pillow alone: the model view grid and the head-distance plot.

`attnkit explain` writes these by default. Importing matplotlib and laying out one Axes per
heatmap cost it ~2.5 s of its ~7 s; here each heatmap is one colour-mapped array scaled and
pasted, labels are drawn once per row or column, and nothing from matplotlib is imported
(its DejaVu Sans font file is used when installed, for the glyphs of non-Latin tokens; a
picture with CJK text is drawn with the CJK font of `attnkit.viz.fonts`).
The same pictures as matplotlib figures: `attnkit.viz.model_view`,
`attnkit.viz.head_plots.head_distance_figure`.

Dimensions: L layers, H heads, N queries, S keys.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from torch import Tensor

from attnkit.viz.labels import token_labels

__all__ = ["head_distance_png", "model_view_png", "pool_tokens", "viridis"]

# matplotlib's viridis at 33 evenly spaced points (0, 1/32, ..., 1), 0-255; `viridis`
# interpolates linearly between them (within 3/255 of matplotlib's 256-entry table).
_VIRIDIS = np.array(
    [
        [68, 1, 84], [71, 13, 96], [72, 24, 106], [72, 35, 116], [71, 45, 123], [69, 55, 129],
        [66, 64, 134], [62, 73, 137], [59, 82, 139], [55, 91, 141], [51, 99, 141],
        [47, 107, 142], [44, 114, 142], [41, 122, 142], [38, 130, 142], [35, 137, 142],
        [33, 145, 140], [31, 152, 139], [31, 160, 136], [34, 167, 133], [40, 174, 128],
        [50, 182, 122], [63, 188, 115], [78, 195, 107], [94, 201, 98], [112, 207, 87],
        [132, 212, 75], [152, 216, 62], [173, 220, 48], [194, 223, 35], [216, 226, 25],
        [236, 229, 27], [253, 231, 37],
    ],
    dtype=np.float64,
)  # fmt: skip
_WHITE, _INK, _GREY = (255, 255, 255), (0, 0, 0), (102, 102, 102)


def viridis(values: np.ndarray) -> np.ndarray:
    """Colours (..., 3) uint8 for values (...) in [0, 1] (clipped)."""
    x = np.clip(np.nan_to_num(values, nan=0.0), 0.0, 1.0) * (len(_VIRIDIS) - 1)
    lo = np.minimum(x.astype(np.int64), len(_VIRIDIS) - 2)
    frac = (x - lo)[..., None]
    return np.rint(_VIRIDIS[lo] * (1 - frac) + _VIRIDIS[lo + 1] * frac).astype(np.uint8)


def _require_pillow() -> None:
    from attnkit._optional import require

    require("PIL.Image", "viz", "drawing PNG pictures")


@functools.lru_cache(maxsize=32)
def _font(size: int, cjk: bool = False):
    """DejaVu Sans (matplotlib's font file, found without importing matplotlib), else
    Pillow's own; loaded once per size. `cjk`: the CJK font of `attnkit.viz.fonts` (it has
    Latin glyphs too; Pillow has no per-glyph fallback) when one is installed."""
    from PIL import ImageFont

    from attnkit.viz import fonts

    path = fonts.cjk_font_file() if cjk else None
    if path is not None:
        return ImageFont.truetype(str(path), size, index=fonts.cjk_face_index(path))

    spec = importlib.util.find_spec("matplotlib")
    for root in spec.submodule_search_locations or [] if spec else []:
        path = Path(root) / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
        if path.is_file():
            return ImageFont.truetype(str(path), size)
    return ImageFont.load_default(size=size)


def _any_cjk(texts: Sequence[str]) -> bool:
    from attnkit.viz.fonts import has_cjk

    return any(has_cjk(t) for t in texts)


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)  # speed over a few kB
    return buffer.getvalue()


def _vertical(text: str, font, fill=_INK):
    """`text` drawn reading upwards (rotated 90°), on a transparent image."""
    from PIL import Image, ImageDraw

    left, top, right, bottom = font.getbbox(text)
    img = Image.new("RGBA", (max(1, right - left), max(1, bottom - top)), (0, 0, 0, 0))
    ImageDraw.Draw(img).text((-left, -top), text, font=font, fill=fill)
    return img.rotate(90, expand=True)


def model_view_png(
    maps: Tensor,
    q_labels: Sequence[str],
    k_labels: Sequence[str],
    layer_names: Sequence[str],
    head_names: Sequence[str],
    title: str,
    *,
    cell: int = 160,
) -> bytes:
    """PNG of maps (L, H, n, s) as an L × H grid of heatmaps on one colour scale
    (0 to the largest weight), query labels left, key labels below, a colour bar right."""
    _require_pillow()
    from PIL import Image, ImageDraw

    data = maps.detach().float().numpy()
    L, H, n, s = data.shape
    cjk = _any_cjk([*q_labels, *k_labels, *layer_names, *head_names, title])
    vmax = max(float(data.max()), 1e-6)
    gap, left, bottom, top, right = 8, 150, 120, 64, 90
    width, height = left + H * (cell + gap) + right, top + L * (cell + gap) + bottom
    img = Image.new("RGB", (width, height), _WHITE)
    draw = ImageDraw.Draw(img)
    # Labels as dense as the font allows: every k-th when rows are narrower than 7 px.
    q_step, k_step = max(1, math.ceil(7 * n / cell)), max(1, math.ceil(7 * s / cell))
    label = _font(int(max(7, min(11, 0.8 * cell * min(q_step / n, k_step / s)))), cjk)
    small = _font(11, cjk)
    rgb = viridis(data / vmax)  # (L, H, n, s, 3)
    for li in range(L):
        y0 = top + li * (cell + gap)
        for hi in range(H):
            x0 = left + hi * (cell + gap)
            tile = Image.fromarray(rgb[li, hi], "RGB").resize((cell, cell), Image.NEAREST)
            img.paste(tile, (x0, y0))
            if li == 0:
                draw.text(
                    (x0 + cell / 2, y0 - 4), head_names[hi], font=small, fill=_INK, anchor="md"
                )
            if li == L - 1:
                for j in range(0, s, k_step):
                    word = _vertical(k_labels[j], label)
                    cx = x0 + (j + 0.5) * cell / s
                    img.paste(word, (int(cx - word.width / 2), y0 + cell + 4), word)
        for i in range(0, n, q_step):
            cy = y0 + (i + 0.5) * cell / n
            draw.text((left - 5, cy), q_labels[i], font=label, fill=_INK, anchor="rm")
        name = _vertical(layer_names[li], small)
        img.paste(name, (4, int(y0 + cell / 2 - name.height / 2)), name)
    _colorbar(
        img, draw, (width - right + 14, top), 14, L * (cell + gap) - gap, (0.0, vmax), "", cjk
    )
    for k, line in enumerate(title.split("\n")):
        draw.text(
            (width / 2, 8 + 18 * k), line, font=_font(14 - 2 * k, cjk), fill=_INK, anchor="ma"
        )
    return _png(img)


def _colorbar(img, draw, at, w: int, h: int, span: tuple[float, float], name: str, cjk: bool):
    """A vertical viridis bar of size w × h at `at`, ticks at span's ends and middle."""
    from PIL import Image

    lo, hi = span
    ramp = viridis(np.linspace(1.0, 0.0, h))[:, None, :].repeat(w, axis=1)  # (h, w, 3)
    img.paste(Image.fromarray(ramp, "RGB"), at)
    x, y = at
    font = _font(10, cjk)
    for frac in (0.0, 0.5, 1.0):
        ty = y + (1 - frac) * (h - 1)
        draw.line([(x + w, ty), (x + w + 3, ty)], fill=_INK)
        draw.text(
            (x + w + 7, ty), f"{lo + frac * (hi - lo):.2f}", font=font, fill=_INK, anchor="lm"
        )
    if name:
        text = _vertical(name, font)
        img.paste(text, (x + w + 44, int(y + h / 2 - text.height / 2)), text)


def head_distance_png(
    distance: Tensor, entropy: Tensor, layer_names: Sequence[str], title: str, unit: str
) -> bytes:
    """PNG: mean attention distance (L, H) per head against layer, coloured by entropy
    (L, H), with the mean over heads as a grey line (the ViT paper's Fig. 7)."""
    _require_pillow()
    from PIL import Image, ImageDraw

    dist, ent = distance.float().numpy(), entropy.float().numpy()
    L, H = dist.shape
    left, right, top, bottom = 70, 120, 46, 56
    width = int(100 * (1.2 + 0.9 * max(L, 6)))
    height = 420
    img = Image.new("RGB", (width, height), _WHITE)
    draw = ImageDraw.Draw(img)
    x0, x1, y0, y1 = left, width - right, top, height - bottom  # the plot area
    ymax = _nice(float(np.nanmax(dist)) if np.isfinite(dist).any() else 1.0)
    cjk = _any_cjk([*layer_names, title])
    font = _font(11, cjk)

    def px(layer: float, value: float) -> tuple[float, float]:
        fx = (layer + 0.5) / L
        return x0 + fx * (x1 - x0), y1 - (value / ymax) * (y1 - y0)

    for k in range(5):  # y ticks and light grid lines
        v = ymax * k / 4
        _, ty = px(0, v)
        draw.line([(x0, ty), (x1, ty)], fill=(235, 235, 235))
        draw.text((x0 - 6, ty), f"{v:.3g}", font=font, fill=_INK, anchor="rm")
    e_lo, e_hi = float(np.nanmin(ent)), float(np.nanmax(ent))
    colours = viridis((ent - e_lo) / max(e_hi - e_lo, 1e-12))  # (L, H, 3)
    means = np.nanmean(dist, axis=1)
    draw.line([px(li, float(means[li])) for li in range(L)], fill=_GREY, width=1)
    jitter = np.linspace(-0.18, 0.18, H) if H > 1 else np.zeros(1)
    for li in range(L):
        for hi in range(H):
            if np.isfinite(dist[li, hi]):
                cx, cy = px(li + jitter[hi], float(dist[li, hi]))
                fill = tuple(int(c) for c in colours[li, hi])
                draw.ellipse([cx - 3.5, cy - 3.5, cx + 3.5, cy + 3.5], fill=fill)
        cx, _ = px(li, 0)
        draw.text((cx, y1 + 6), layer_names[li], font=font, fill=_INK, anchor="ma")
    draw.rectangle([x0, y0, x1, y1], outline=_INK)
    draw.text(((x0 + x1) / 2, height - 8), "layer", font=font, fill=_INK, anchor="md")
    ylabel = _vertical(f"mean attention distance ({unit})", font)
    img.paste(ylabel, (6, int((y0 + y1) / 2 - ylabel.height / 2)), ylabel)
    draw.line([(x0 + 10, y0 + 14), (x0 + 30, y0 + 14)], fill=_GREY)
    draw.text((x0 + 34, y0 + 14), "mean over heads", font=_font(10, cjk), fill=_INK, anchor="lm")
    _colorbar(img, draw, (x1 + 20, y0), 14, y1 - y0, (e_lo, e_hi), "entropy (nats)", cjk)
    head = _font(12, cjk)
    draw.text((width / 2, 10), _fit(title, head, width - 20), font=head, fill=_INK, anchor="ma")
    return _png(img)


def _nice(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 × 10^k at least `value` (an axis top)."""
    if not value > 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value)


def _fit(text: str, font, width: int) -> str:
    """`text` cut with an ellipsis to fit `width` pixels."""
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + "…") > width:
        text = text[:-1]
    return text + "…"


def pool_tokens(
    data: Tensor, labels: list[str], *, dim: int, max_blocks: int, op: str
) -> tuple[Tensor, list[str], int]:
    """Pool ``data`` (L, H, N, S) along ``dim`` into at most ``max_blocks`` blocks of
    consecutive tokens ("mean" or "sum"); returns the pooled tensor, block labels (tokens
    shown by `attnkit.viz.labels.token_labels`) and block size (1: unchanged)."""
    import torch

    labels = token_labels(labels)  # "Ġcat" -> "cat", as every picture shows tokens
    size = data.shape[dim]
    if size <= max_blocks:
        return data, labels, 1
    block = math.ceil(size / max_blocks)
    pad = block * math.ceil(size / block) - size
    padded = torch.nn.functional.pad(data.movedim(dim, -1), (0, pad))  # (..., blocks * block)
    blocks = padded.unflatten(-1, (-1, block))  # (..., blocks, block)
    if op == "sum":
        pooled = blocks.sum(-1)
    else:  # mean over the real (unpadded) members of each block
        members = torch.full((blocks.shape[-2],), float(block))
        members[-1] = block - pad
        pooled = blocks.sum(-1) / members
    out = pooled.movedim(-1, dim)
    names = [f"{i}–{min(i + block, size) - 1} {labels[i]}…" for i in range(0, size, block)]
    return out, names, block
