"""Every teaching figure of `attnkit.viz` in the reader's language (issue 37, item 2): with
``lang="zh"`` no label is left in English (symbols, shapes, math and a few terms the Chinese
pages use as they are, such as softmax and LayerNorm, aside) and no glyph is drawn as a box:
matplotlib's "Glyph ... missing from font" warning and mathtext's "does not have a glyph"
message fail the test."""

from __future__ import annotations

import io
import logging
import re
import warnings

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.text import Text

import attnkit
from attnkit import masks
from attnkit import viz as V
from attnkit.viz._lang import translate
from attnkit.viz.fonts import has_cjk

# English the Chinese pages keep: function and layer names, and the data's special tokens.
ALLOWED = {"softmax", "sigmoid", "LayerNorm", "memory", "CLS", "SEP"}
_MATH = re.compile(r"\$[^$]*\$")
_CODE = re.compile(r"\b\w+\([^()]*\)")  # a mask's description, e.g. window(8, causal)


def english_words(text: str) -> list[str]:
    """The English words of a label: two or more letters, not math, code or an allowed
    term; short capitals (QK, AV, XW, PE) and lower-case math (qk) count as symbols."""
    text = _CODE.sub(" ", _MATH.sub(" ", text))
    return [
        w for w in re.findall(r"[A-Za-z]{2,}", text)
        if w not in ALLOWED and not (len(w) <= 3 and (w.isupper() or w in {"qk"}))
    ]  # fmt: skip


def labels(artist) -> list[str]:
    """The texts of a figure that are labels: not tick labels (numbers, tokens) and not the
    data's tokens (gid="token")."""
    ticks = set()
    for ax in artist.findobj(Axes):
        for axis in (ax.xaxis, ax.yaxis):
            ticks.update(map(id, axis.get_ticklabels(which="both")))
    return [
        t.get_text() for t in artist.findobj(Text)
        if t.get_text().strip() and id(t) not in ticks and t.get_gid() != "token"
    ]  # fmt: skip


def _figures(lang: str):
    """(name, figure) for every teaching figure, on small inputs (tokens in Chinese)."""
    import matplotlib.pyplot as plt

    torch.manual_seed(0)
    x = torch.randn(4, 6)
    words = ["猫", "坐", "在", "垫子"]
    yield "steps", V.attention_steps_figure(x, x, x, x, tokens=words, lang=lang)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    yield "row", V.attention_row_figure(x, x, x, 2, mask=causal, lang=lang)
    mha = attnkit.MultiHeadAttention(24, 3).eval()
    yield "heads", V.multi_head_figure(mha, torch.randn(2, 7, 24), lang=lang)
    yield "soft split", V.soft_split_figure(torch.rand(10, 10), 4, 2, 1, windows=(0, 5), lang=lang)
    gates = (torch.rand(8), torch.rand(4, 5), torch.rand(20).softmax(0).reshape(4, 5))
    yield "gates", V.channel_spatial_figure(*gates, position=(1, 2), lang=lang)
    yield "masks", V.plot_masks({"因果": causal}, {"因果": torch.rand(4, 4)}, lang=lang)
    yield "positions", V.plot_positional_encoding(torch.randn(40, 16), starts=(0, 5), lang=lang)
    for pre_norm in (False, True):
        yield "transformer", V.plot_transformer(
            src_shape=(3, 8), tgt_shape=(3, 7), d_model=32, d_ff=64, vocab=11, num_heads=2,
            layers=(2, 3), pre_norm=pre_norm, lang=lang,
        )  # fmt: skip
    fig, ax = plt.subplots()
    V.plot_block_map(masks.window(64, 8, causal=True), 16, ax=ax, lang=lang)
    yield "block map", fig
    maps = V.AttentionMaps(["[CLS]", "它", "累", "[SEP]"], torch.rand(2, 3, 4, 4).softmax(-1))
    fig, ax = plt.subplots()
    V.draw_head_lines(ax, maps, 1, 2, query="它", lang=lang)
    yield "lines", fig
    yield "layer view", V.layer_view(maps, 1, lang=lang)
    yield "model view", V.model_view(maps, lang=lang)


def test_chinese_figures_have_chinese_labels_and_every_glyph(caplog):
    caplog.set_level(logging.WARNING, logger="matplotlib")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*missing from font")
        for name, fig in _figures("zh"):
            texts = labels(fig)
            assert any(has_cjk(t) for t in texts), name
            english = {t: english_words(t) for t in texts if english_words(t)}
            assert not english, f"{name}: English labels in the Chinese figure: {english}"
            fig.savefig(io.BytesIO(), format="png")  # draws every glyph
            matplotlib.pyplot.close(fig)
    boxes = [r.getMessage() for r in caplog.records if "does not have a glyph" in r.getMessage()]
    assert not boxes, boxes[:3]


def test_english_figures_stay_english():
    for name, fig in _figures("en"):
        texts = labels(fig)
        data = {"猫", "坐", "在", "垫子", "它", "累", "因果"}  # the inputs' own words
        assert not any(has_cjk(t) for t in texts if t not in data), name
        matplotlib.pyplot.close(fig)


def test_the_checks_can_fail():
    assert english_words("head 3") == ["head"]
    assert english_words("3 号头") == []
    assert english_words("softmax(QK$^T$/√d$_k$)V：六个步骤") == []
    assert english_words("window(8, causal)\n密度 0.1") == []
    assert translate("head 3", "zh") == "3 号头" and translate("head 3", "en") == "head 3"
    assert translate("no such label", "zh") == "no such label"  # which the test above catches
    with pytest.raises(ValueError, match="lang: expected one of"):
        V.plot_positional_encoding(torch.randn(40, 16), starts=(0,), lang="fr")
