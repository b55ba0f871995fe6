"""Write docs/assets/javascripts/play-data.js, the numbers of the tutorials' interactive figures
(docs/assets/javascripts/play.js), computed with attnkit.

    python tests/docs/make_play.py          # rewrite the data
    python tests/docs/make_play.py --check  # exit 1 if it is out of date

- softmax (tutorial 01, "Why divide by √d_k?"): one query's scores against 10 keys at d_k = 64
  (entries of q and k drawn from N(0, 1), so the scores have standard deviation ≈ 8); the page
  divides them by a slider's value, √d_k = 8 at the start;
- row (tutorial 01, "Attention grown from averaging the past"): the scaled causal scores and
  the weights of the page's own six tokens (q4, k4, v4, the figure 01-one-row.png above it),
  from `attnkit.attention(..., causal=True, need_weights=True)`;
- mask (tutorial 04): 16 × 16 masks from `attnkit.masks` to start the mask builder from.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "assets" / "javascripts" / "play-data.js"
PAGE_01 = ROOT / "docs" / "en" / "tutorials" / "01-self-attention.md"
MASK_N, MASK_BLOCK = 16, 4
HEAD = "// Made by tests/docs/make_play.py from attnkit; do not edit.\nwindow.AK_PLAY = "


def _round(values) -> list:
    return [None if v is None or math.isinf(v) else round(v, 6) for v in values]


def softmax_data() -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    d_k = 64
    q = torch.randn(1, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(10, d_k, generator=g, dtype=torch.float64)
    scores = (k @ q[0]).tolist()  # (10,) raw dot products
    return {"d_k": d_k, "default": math.sqrt(d_k), "scores": _round(scores)}


def page_tokens() -> tuple:
    """q4, k4, v4 of tutorial 01, as its page computes them (its blocks run in order, with the
    page test's seed and threads, until q4 exists)."""
    import contextlib
    import io
    import tempfile

    from tests.docs.pages import _page_state, parse

    namespace: dict = {"__name__": "__main__"}
    with tempfile.TemporaryDirectory() as tmp, _page_state(Path(tmp)):
        for block in parse(PAGE_01.read_text(encoding="utf-8")):
            if block.kind != "python":
                continue
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(block.code, str(PAGE_01), "exec"), namespace)
            if "q4" in namespace:
                return namespace["q4"], namespace["k4"], namespace["v4"]
    raise RuntimeError(f"{PAGE_01} no longer defines q4, k4, v4")


def row_data() -> dict:
    import torch

    import attnkit

    q4, k4, v4 = (t.double() for t in page_tokens())
    t, head = q4.shape
    res = attnkit.attention(q4[None, None], k4[None, None], v4[None, None], causal=True,
                            need_weights=True)  # fmt: skip
    scores = (q4 @ k4.T / math.sqrt(head)).masked_fill(
        ~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")
    )  # (T, T), the future at -inf
    return {
        "default": 4,
        "scores": [_round(row) for row in scores.tolist()],
        "weights": [_round(row) for row in res.weights[0, 0].tolist()],
    }


def mask_data() -> dict:
    import torch

    from attnkit import masks

    n = MASK_N
    made = {
        "causal": masks.causal(n),  # a tensor (1, 1, N, N)
        "window": masks.window(n, 4, causal=True),
        "prefix": masks.prefix(n, 6),
        "documents": masks.document(masks.document_ids([5, 4, 7]), causal=True),
    }
    presets = {}
    for name, mask in made.items():
        dense = mask if isinstance(mask, torch.Tensor) else mask.dense()
        presets[name] = ["".join("1" if x else "0" for x in row) for row in dense[0, 0].tolist()]
    presets["all"] = ["1" * n] * n
    presets["none"] = ["0" * n] * n
    return {"n": n, "block": MASK_BLOCK, "default": "window", "presets": presets}


def render() -> str:
    data = {"softmax": softmax_data(), "row": row_data(), "mask": mask_data()}
    return HEAD + json.dumps(data, ensure_ascii=False, separators=(",", ":")) + ";\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        stale = not DATA.exists() or DATA.read_text(encoding="utf-8") != text
        if stale:
            print(f"out of date: {DATA.relative_to(ROOT)}")
        return 1 if stale else 0
    DATA.write_text(text, encoding="utf-8")
    print(f"wrote {DATA.relative_to(ROOT)} ({len(text):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
