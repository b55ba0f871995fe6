"""The files `attnkit explain` writes, rendered by `attnkit.viz` (imported lazily: matplotlib
is slow to import and only needed here).

Dimensions: L layers, H heads, N tokens.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from torch import Tensor

from attnkit.cli._errors import UsageError

__all__ = ["FILES", "write_all"]

FILES = ("head_view.html", "model_view.png", "attention.json")


def render(tokens: list[str], maps: Tensor, layer_names: list[str], meta: dict) -> list[bytes]:
    """The contents of `FILES` for maps (L, H, N, N), all in memory."""
    from attnkit.viz import AttentionMaps, head_view, model_view

    attn = AttentionMaps(tokens, maps, layer_names=layer_names)
    title = f"attnkit explain: {meta['text']!r}, focus {meta['focus']['token']!r}"
    html = head_view(attn, layer=-1, head="mean", title=title)
    png = io.BytesIO()
    model_view(attn, title=title).savefig(png, format="png", dpi=100)
    data = attn.to_json_dict()
    data["explain"] = meta  # extra key; AttentionMaps.from_json_dict ignores it
    return [html.encode("utf-8"), png.getvalue(), json.dumps(data).encode("utf-8")]


def write_all(
    out: Path, tokens: list[str], maps: Tensor, layer_names: list[str], meta: dict
) -> list[Path]:
    """Render everything first, then write each file atomically (temp name + os.replace)."""
    from attnkit._io import atomic_write_bytes

    contents = render(tokens, maps, layer_names, meta)
    try:
        return [atomic_write_bytes(out / n, c) for n, c in zip(FILES, contents, strict=True)]
    except OSError as e:
        raise UsageError(
            f"cannot write to --out {str(out)!r} ({e.strerror}): pick another folder"
        ) from None
