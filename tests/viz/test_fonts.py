"""CJK text in every picture attnkit draws (issue 37 item 2, issue 38 item 2): matplotlib with
the fallback font of `attnkit.viz.fonts`, Pillow's PNGs, and the head view's embedded subset.
A glyph drawn as a box fails: matplotlib's "Glyph ... missing from font" warning is an error
here, and Pillow's boxes are all alike."""

from __future__ import annotations

import base64
import io
import json
import re
import warnings

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

from attnkit.viz import AttentionMaps, fonts, head_view

CHINESE = "注意力权重：它→动物"


def _draw_title(text: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 1))
    fig.suptitle(text)
    fig.savefig(io.BytesIO(), format="png")


def test_the_cjk_font_is_installed_with_the_viz_extra():
    path = fonts.cjk_font_file()
    assert path is not None and path.is_file(), fonts.INSTALL_HINT
    assert fonts.has_cjk(CHINESE) and fonts.has_cjk("，") and not fonts.has_cjk("attention é")


def test_matplotlib_draws_chinese_without_missing_glyphs():
    with matplotlib.rc_context({"font.family": ["DejaVu Sans"]}):
        with pytest.warns(UserWarning, match="missing from font"):  # the failure we catch
            _draw_title(CHINESE)
        assert fonts.use_cjk_font()
        assert matplotlib.rcParams["font.family"][0] == "DejaVu Sans"  # Latin text unchanged
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*missing from font")
            _draw_title(CHINESE + " weights 0.5")


def _ink(font, text: str) -> np.ndarray:
    from PIL import Image, ImageDraw

    img = Image.new("L", (40, 40), 0)
    ImageDraw.Draw(img).text((4, 4), text, font=font, fill=255)
    return np.asarray(img)


def test_pillow_pictures_draw_chinese_glyphs_not_boxes():
    from attnkit.viz.raster import _font

    latin = _font(20)
    assert (_ink(latin, "猫") == _ink(latin, "鼠")).all()  # DejaVu: the same empty box
    cjk = _font(20, True)
    cat, mouse = _ink(cjk, "猫"), _ink(cjk, "鼠")
    assert cat.any() and mouse.any() and not (cat == mouse).all()


def _maps(tokens: list[str]) -> AttentionMaps:
    torch.manual_seed(0)
    n = len(tokens)
    return AttentionMaps(tokens, torch.rand(2, 3, n, n).softmax(-1))


def test_head_view_embeds_the_glyphs_its_tokens_use():
    from fontTools.ttLib import TTFont

    html = head_view(_maps(["[CLS]", "它", "很", "高兴", "[SEP]"]), title="一个例子")
    face = re.search(r"data:font/woff;base64,([A-Za-z0-9+/=]+)", html)
    assert face, "no embedded font"
    font = TTFont(io.BytesIO(base64.b64decode(face.group(1))))
    cmap = font.getBestCmap()
    assert {ord(c) for c in "它很高兴一个例子"} <= set(cmap)
    assert len(cmap) < 40  # a subset, not the font
    assert "font-src data:" in html  # the page's CSP lets the embedded font load
    assert "@font-face" not in head_view(_maps(["[CLS]", "cat", "[SEP]"]))


def _payload(html: str) -> dict:
    return json.loads(re.search(r'id="ak-data">(.*?)</script>', html, re.S).group(1))


def test_head_view_interface_in_chinese():
    html = head_view(_maps(["[CLS]", "猫", "[SEP]"]), lang="zh", query=1)
    assert '<html lang="zh">' in html
    for word in ("层", "头", "查询", "线的不透明度"):
        assert word in html
    data = _payload(html)
    assert data["ui"]["mean"] == "各头的平均" and data["initialQuery"] == 1
    assert all(fonts.has_cjk(note) for note in data["notes"])
    english = head_view(_maps(["[CLS]", "猫", "[SEP]"]))
    assert '<html lang="en">' in english and _payload(english)["initialQuery"] is None
    assert _payload(head_view(_maps(["a", "b", "c"]), query=-1))["initialQuery"] == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"lang": "fr"}, "lang: expected one of"), ({"query": 3}, "query: expected None or an int"),
     ({"query": True}, "query"), ({"query": "猫"}, "query")],
)  # fmt: skip
def test_head_view_rejects_a_bad_lang_or_query(kwargs, match):
    with pytest.raises(ValueError, match=match):
        head_view(_maps(["[CLS]", "猫", "[SEP]"]), **kwargs)


def test_without_a_cjk_font_matplotlib_hears_which_font_to_install(monkeypatch):
    monkeypatch.setattr(fonts, "cjk_font_file", lambda: None)
    fonts._warn_missing.cache_clear()
    with pytest.warns(RuntimeWarning, match="no CJK font found.*pip install noto-cjk-sans-otc"):
        assert fonts.use_cjk_font() is False
    assert fonts.use_cjk_font(quiet=True) is False  # the figure modules' call at import: silent
    assert fonts.css_subset("猫") is None
    fonts._warn_missing.cache_clear()
