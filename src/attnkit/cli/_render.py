"""The files `attnkit explain` writes, rendered by `attnkit.viz` (imported lazily: matplotlib
is slow to import and only needed here).

Dimensions: L layers, H heads, N tokens.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from torch import Tensor

from attnkit.analysis.heads import HeadStats
from attnkit.cli._errors import UsageError

__all__ = ["FILES", "write_all"]

FILES = ("head_view.html", "model_view.png", "attention.json", "head_distance.png")


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def render(
    tokens: list[str], maps: Tensor, layer_names: list[str], meta: dict, stats: HeadStats
) -> list[bytes]:
    """The contents of `FILES` for maps (L, H, N, N) and their head statistics, in memory."""
    from attnkit.viz import AttentionMaps, head_view, model_view
    from attnkit.viz.head_plots import head_distance_figure

    attn = AttentionMaps(tokens, maps, layer_names=layer_names)
    title = f"attnkit explain: {meta['text']!r}, focus {meta['focus']['token']!r}"
    html = head_view(attn, layer=-1, head="mean", title=title)
    distances = head_distance_figure(stats, layer_names=layer_names, title=title)
    data = attn.to_json_dict()
    data["explain"] = meta  # extra key; AttentionMaps.from_json_dict ignores it
    data["head_stats"] = {
        "distance_tokens": stats.distance.tolist(),
        "entropy_nats": stats.entropy.tolist(),
        "special_share": None if stats.special_share is None else stats.special_share.tolist(),
    }
    return [
        html.encode("utf-8"),
        _png(model_view(attn, title=title)),
        json.dumps(data).encode("utf-8"),
        _png(distances),
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
