"""The files `attnkit explain` writes: the head view (HTML), the model view and the head
distances (PNG, drawn with Pillow by `attnkit.viz.raster`: importing matplotlib and one Axes
per heatmap made rendering half of explain's time), the maps (JSON).

Dimensions: L layers, H heads, N tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import Tensor

from attnkit.analysis.heads import HeadStats
from attnkit.cli._errors import UsageError

__all__ = ["FILES", "write_all"]

FILES = ("head_view.html", "model_view.png", "attention.json", "head_distance.png")


MAX_TOKENS = 64  # longer inputs are pooled into this many blocks per axis in the PNG


def _model_view_png(attn, title: str, heads: list[int]) -> bytes:
    """The model view (every layer × head) drawn by `attnkit.viz.raster` (no matplotlib)."""
    from attnkit.viz.raster import model_view_png, pool_tokens

    L, H, N, S = attn.shape
    data, q_labels, q_block = pool_tokens(
        attn.maps, attn.tokens, dim=2, max_blocks=MAX_TOKENS, op="mean"
    )
    data, k_labels, k_block = pool_tokens(
        data, attn.key_tokens or attn.tokens, dim=3, max_blocks=MAX_TOKENS, op="sum"
    )
    note = f"{N} queries × {S} keys"
    if q_block > 1 or k_block > 1:
        note += (
            f"; pooled to {data.shape[2]} × {data.shape[3]} blocks of ≤{q_block} queries "
            f"(mean) × ≤{k_block} keys (sum)"
        )
    cell = int(max(24, min(160, 1960 / H - 8, 1800 / L - 8)))  # px: PNG <= 2200 x 2000
    return model_view_png(
        data,
        q_labels,
        k_labels,
        attn.names,
        [f"head {h}" for h in heads],
        f"{title}\n{note}",
        cell=cell,
    )


def render(
    tokens: list[str], maps: Tensor, layer_names: list[str], meta: dict, stats: HeadStats
) -> list[bytes]:
    """The contents of `FILES` for maps (L, H, N, N) and their head statistics, in memory."""
    from attnkit.viz import AttentionMaps, head_view
    from attnkit.viz.raster import head_distance_png

    attn = AttentionMaps(tokens, maps, layer_names=layer_names)
    title = f"attnkit explain: {meta['text']!r}, focus {meta['focus']['token']!r}"
    view = meta.get("view")  # the layer and head the printout names, on the focus word
    if view is None:
        html = head_view(attn, layer=-1, head="mean", query=meta["focus"]["index"], title=title)
    else:
        where = (meta["layers"].index(view["layer"]), meta["heads"].index(view["head"]))
        html = head_view(
            attn, layer=where[0], head=where[1], query=meta["focus"]["index"], title=title
        )
    data = attn.to_json_dict()
    data["explain"] = meta  # extra key; AttentionMaps.from_json_dict ignores it
    data["head_stats"] = {
        "distance_tokens": stats.distance.tolist(),
        "entropy_nats": stats.entropy.tolist(),
        "special_share": None if stats.special_share is None else stats.special_share.tolist(),
    }
    distances = head_distance_png(
        stats.distance,
        stats.entropy,
        layer_names,
        f"{title}: attention distance per head",
        "tokens",
    )
    return [
        html.encode("utf-8"),
        _model_view_png(attn, title, meta.get("heads", list(range(maps.shape[1])))),
        json.dumps(data).encode("utf-8"),
        distances,
    ]


def write_all(
    out: Path,
    tokens: list[str],
    maps: Tensor,
    layer_names: list[str],
    meta: dict,
    stats: HeadStats,
) -> list[Path]:
    """Render everything first, then write each file atomically (temp name + os.replace)."""
    from attnkit._io import atomic_write_bytes

    contents = render(tokens, maps, layer_names, meta, stats)
    try:
        return [atomic_write_bytes(out / n, c) for n, c in zip(FILES, contents, strict=True)]
    except OSError as e:
        raise UsageError(
            f"cannot write to --out {str(out)!r} ({e.strerror}): pick another folder"
        ) from None
