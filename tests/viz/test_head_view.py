"""head_view: a self-contained, offline, compact HTML page whose embedded data is right."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
import torch

from attnkit.viz import AttentionMaps, head_view, write_html


def probs(*shape: int, seed: int = 0, temp: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * temp).softmax(-1)


def payload(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="ak-data">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1))


def dense(p: dict) -> np.ndarray:
    """Decode the page's sparse data into (L, H + 1, n, s) as the page's script does."""
    L, H = p["shape"][:2]
    n, s = len(p["tokens"]), len(p["keyTokens"])
    counts = np.frombuffer(base64.b64decode(p["counts"]), np.uint8)
    keys = np.frombuffer(base64.b64decode(p["keys"]), "<u2")
    w = np.frombuffer(base64.b64decode(p["weights"]), np.uint8) / p["quant"]
    assert counts.size == L * (H + 1) * n and keys.size == w.size == counts.sum(dtype=np.int64)
    out = np.zeros((L * (H + 1) * n, s))
    rows = np.repeat(np.arange(counts.size), counts)  # the row of every stored entry
    out[rows, keys] = w
    return out.reshape(L, H + 1, n, s)


def expected(maps: torch.Tensor, top_k: int, threshold: float) -> np.ndarray:
    """Reference: heads + mean, keep each row's top_k weights >= threshold, zero the rest."""
    full = torch.cat([maps, maps.mean(1, keepdim=True)], dim=1).double()  # (L, H + 1, N, S)
    kth = full.topk(min(top_k, full.shape[-1]), dim=-1).values[..., -1:]
    return torch.where((full >= kth) & (full >= threshold), full, 0.0).numpy()


@pytest.fixture
def small() -> AttentionMaps:
    toks = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    return AttentionMaps(toks, probs(2, 3, 8, 8), layer_names=["enc 0", "enc 1"])


def test_is_one_self_contained_document(small):
    html = head_view(small, title="My <view>")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "http://" not in html and "https://" not in html
    assert not re.search(r"""\b(src|href)\s*=""", html)  # nothing loaded from anywhere
    assert "url(" not in html and "<link" not in html and "@import" not in html
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert "<title>My &lt;view&gt;</title>" in html
    assert 'id="ak-layer"' in html and 'id="ak-head"' in html and "ak-legend" in html
    assert html.count("<script") == 2  # the data and the inline program


def test_embedded_data_decodes_to_the_maps(small):
    p = payload(head_view(small, top_k=3, threshold=0.05))
    assert p["tokens"] == small.tokens and p["keyTokens"] == small.tokens
    assert p["layerNames"] == ["enc 0", "enc 1"] and p["shape"] == [2, 3, 8, 8]
    got = dense(p)
    want = expected(small.maps, top_k=3, threshold=0.05)
    np.testing.assert_allclose(got, want, atol=0.5 / 255 + 1e-9)
    assert (got > 0).sum() == (want > 0).sum()


def test_mean_of_heads_is_computed_before_dropping():
    # Head 0 attends to key 0 only, head 1 to key 1 only: the mean is 0.5 / 0.5.
    maps = torch.zeros(1, 2, 2, 2)
    maps[0, 0, :, 0] = 1.0
    maps[0, 1, :, 1] = 1.0
    got = dense(payload(head_view(AttentionMaps(["x", "y"], maps), top_k=1)))
    assert got[0, 2].max() == pytest.approx(128 / 255)  # mean row keeps one 0.5 weight
    np.testing.assert_allclose(got[0, :2], maps[0].numpy())


def test_initial_layer_and_head(small):
    assert payload(head_view(small))["initialHead"] == 3  # None -> mean (index H)
    p = payload(head_view(small, layer=-1, head=1))
    assert (p["initialLayer"], p["initialHead"]) == (1, 1)
    assert payload(head_view(small, head="mean"))["initialHead"] == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layer": 2}, r"layer: expected an int in \[-2, 2\)"),
        ({"head": 3}, r"head: expected an int in \[-3, 3\), 'mean' or None.*\(2, 3, 8, 8\)"),
        ({"head": "all"}, r"head:"),
        ({"max_tokens": 0}, r"max_tokens"),
        ({"top_k": 0}, r"top_k"),
        ({"threshold": 1.5}, r"threshold"),
        ({"threshold": "0.1"}, r"threshold"),
    ],
)
def test_bad_arguments(small, kwargs, match):
    with pytest.raises(ValueError, match=match):
        head_view(small, **kwargs)
    with pytest.raises(ValueError, match="maps: expected AttentionMaps"):
        head_view(small.maps)  # type: ignore[arg-type]


def test_tokens_cannot_break_out_of_the_page():
    evil = ["</script><script>alert(1)</script>", "<!--", "&amp;", "a\u2028b"]
    html = head_view(AttentionMaps(evil, probs(1, 1, 4, 4)))
    assert "<script>alert" not in html and "<!--" not in html
    assert payload(html)["tokens"] == evil


def test_cross_attention_and_cropping_are_stated():
    maps = AttentionMaps(
        [f"q{i}" for i in range(20)], probs(1, 2, 20, 30), key_tokens=[f"k{j}" for j in range(30)]
    )
    html = head_view(maps, max_tokens=8)
    p = payload(html)
    assert p["tokens"] == [f"q{i}" for i in range(8)] and len(p["keyTokens"]) == 8
    assert "Cropped to the first 8 of 20 queries and 8 of 30 keys" in " ".join(p["notes"])
    assert dense(p).shape == (1, 3, 8, 8)


def test_notes_state_what_was_dropped():
    maps = AttentionMaps([f"t{i}" for i in range(40)], probs(1, 2, 40, 40, temp=1.0))
    notes = " ".join(payload(head_view(maps, top_k=4, threshold=0.02))["notes"])
    assert "the 4 strongest weights that are ≥ 0.02" in notes
    kept = float(re.search(r"carry ([\d.]+)%", notes).group(1))
    assert 0 < kept < 100
    assert "Mean of heads" in notes


def test_long_input_gives_a_bounded_file():
    """512 tokens, 6 layers × 12 heads (peaky maps, the worst case for sparsity)."""
    L, H, N, top_k = 6, 12, 512, 10
    maps = AttentionMaps([f"w{i}" for i in range(N)], probs(L, H, N, N, temp=4.0))
    html = head_view(maps, top_k=top_k)
    # <= top_k entries of 3 bytes per row, base64 (4/3), plus one count byte per row.
    bound = L * (H + 1) * N * (3 * top_k + 1) * 4 / 3 + 100_000
    assert len(html.encode()) < bound < 3_000_000
    assert len(html.encode()) < L * H * N * N / 10  # far below one byte per weight
    assert (dense(payload(html)) > 0).sum(-1).max() <= top_k


def test_write_html_writes_atomically(tmp_path, small):
    html = head_view(small)
    path = write_html(tmp_path / "sub" / "view.html", html)
    assert path.read_text(encoding="utf-8") == html
    assert sorted(p.name for p in path.parent.iterdir()) == ["view.html"]  # no temp left
