"""The figures' words in the reader's language: ``lang="en"`` (as drawn) or ``lang="zh"``.

Each figure function of `attnkit.viz` draws its English labels, then passes the figure (or
Axes) to :func:`localize`, which rewrites every text artist through the table below: one
place for all the Chinese labels, with the numbers and shapes of each label kept as drawn.
The terms follow the Chinese pages of the site (查询 / 键 / 值, 词元, 掩码, 头). A label the
table does not know stays English; tests/viz/test_figure_lang.py fails on such a label.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["LANGS", "check_lang", "localize", "translate"]

LANGS = ("en", "zh")

# Whole labels, matched exactly.
_EXACT = {
    "query": "查询",
    "key": "键",
    "channel": "通道",
    "channels": "通道",
    "dimension": "维度",
    "dot product": "点积",
    "position": "位置",
    "distance k": "距离 k",
    "pixel of the window": "窗口内的像素",
    "token (window)": "词元（窗口）",
    "attention weights\nquery": "注意力权重\n查询",
    "mask\nquery": "掩码\n查询",
    "Add (x + ·)": "相加 (x + ·)",
    "Add & Norm": "相加与层归一化",
    "cross-attention": "交叉注意力",
    "decoder": "解码器",
    "encoder": "编码器",
    "embedding + positions": "嵌入 + 位置编码",
    "keys, values": "键、值",
    "masked self-attention": "带掩码的自注意力",
    "memory": "memory（编码器输出）",
    "next-token probabilities": "下一个词元的概率",
    "self-attention": "自注意力",
    "source tokens": "源序列词元",
    "target tokens (shifted right)": "目标序列词元（右移一位）",
    "empty: skipped": "空块：跳过",
    "full: no mask": "满块：不用掩码",
    "partial: masked": "部分块：要掩码",
    "softmax(qk$^T$/√D)\n(N, N) per head": "softmax(qkᵀ/√D)\n每个头一张 (N, N)",
    "mean of heads": "各头的平均",
    "input": "输入",
}

# Labels with numbers in them, tried in order; \1, \2 ... keep what the English label drew.
_PATTERNS = [
    (r"Self-attention in six steps: (.*)", r"自注意力的六个步骤：\1"),
    (r"4  A = softmax\(row\)", r"4  A = softmax（按行）"),
    (r"1  scores (.*)", r"1  分数 \1"),
    (r"2  softmax of row (\d+)\n\(sum = (.*)\)", r"2  第 \1 行的 softmax\n（和 = \2）"),
    (r"3  values (.*)", r"3  值 \1"),
    (r"z(\d+) = Σ weight × value", r"z\1 = Σ 权重 × 值"),
    (r"(\d+) tokens", r"\1 个词元"),
    (
        r"Multi-head attention, (\d+) heads of D = (.*), example (\d+)",
        r"多头注意力：\1 个头，每个头 D = \2，第 \3 个样本",
    ),
    (r"concat (.*)", r"拼接 \1"),
    (r"× v = out\n(.*)", r"× v = 输出\n\1"),
    (r"head (\d+)", r"\1 号头"),
    (r"layer (\d+)", r"第 \1 层"),
    (r"layer (\d+), head (\d+)", r"第 \1 层，\2 号头"),
    (
        r"(\d+) windows → (\d+) tokens; neighbours share (\d+) pixel columns?",
        r"\1 个窗口 → \2 个词元；相邻窗口共享 \3 列像素",
    ),
    (
        r"image \((.*)\), padding (\d+)\n(.*) windows, stride (\d+)",
        r"图像 (\1)，填充 \2\n\3 的窗口，步长 \4",
    ),
    (r"tokens \(N, (.*)\) = (.*)", r"词元 (N, \1) = \2"),
    (r"window (\d+)", r"\1 号窗口"),
    (r"window (\d+) → row (\d+)", r"\1 号窗口 → 第 \2 行"),
    (r"attention of one position\nsoftmax: sum = (.*)", r"一个位置的注意力\nsoftmax：和 = \1"),
    (r"channel gates (.*)\nsigmoid: each in \[0, 1\]", r"通道门控 \1\nsigmoid：每个都在 [0, 1] 内"),
    (r"spatial gates (.*)\nsigmoid: each in \[0, 1\]", r"空间门控 \1\nsigmoid：每个都在 [0, 1] 内"),
    (
        r"position table \((\d+) positions × (\d+) dimensions\)",
        r"位置编码表（\1 个位置 × \2 维）",
    ),
    (
        r"B batch, S source length, T target length, (.*)\na shape is the tensor on the arrow "
        r"beside it \(beside a feed-forward: its hidden layer\); red lines: residual connections",
        r"B 批次，S 源序列长度，T 目标序列长度，\1\n形状是它旁边箭头上的张量"
        r"（前馈层旁边的是它的隐藏层）；红线：残差连接",
    ),
    (r"feed-forward (.*)", r"前馈 \1"),
    (r"linear (.*)", r"线性层 \1"),
    (r"key block \((\d+) keys\)", r"键块（每块 \1 个键）"),
    (r"query block \((\d+) queries\)", r"查询块（每块 \1 个查询）"),
    (r"(.*)\ndensity (.*), (\d+)% of blocks computed", r"\1\n密度 \2，计算 \3% 的块"),
    (r"Attention maps\n(\d+) queries × (\d+) keys", r"注意力图\n\1 个查询 × \2 个键"),
    (r"(\d+) queries × (\d+) keys", r"\1 个查询 × \2 个键"),
    (r"weight", r"权重"),
    (r"predicted class (\d+)", r"预测类别 \1"),
    (r"pred (\d+) / true (\d+)", r"预测 \1 / 真实 \2"),
    (
        r"bright = more attention; each map is scaled to its own maximum; the (.*) patch "
        r"grid is upsampled bilinearly over the image",
        r"越亮 = 注意力越多；每张图按自己的最大值缩放；\1 的图块网格以双线性插值放大到整张图像上",
    ),
    (r"cross-attention: (.*)", r"交叉注意力：\1"),
]
_COMPILED = [(re.compile(pattern, re.S), repl) for pattern, repl in _PATTERNS]
# A label with "$" is drawn by mathtext, whose fonts have no CJK glyph and no fallback: a
# translated label spells these with Unicode instead.
_MATH = {"$^T$": "ᵀ", "$_k$": "ₖ", "$^O$": "ᴼ"}


def check_lang(lang: Any) -> str:
    """`lang` itself, or ValueError naming what it must be."""
    if lang not in LANGS:
        raise ValueError(f"lang: expected one of {LANGS}, got {lang!r}")
    return lang


def translate(text: str, lang: str) -> str:
    """`text` in `lang`: the table's words, else `text` unchanged."""
    if lang == "en" or not text:
        return text
    if text in _EXACT:
        return _EXACT[text]
    for pattern, repl in _COMPILED:
        if pattern.fullmatch(text):
            out = pattern.sub(repl, text)
            for math, plain in _MATH.items():
                out = out.replace(math, plain)
            return out
    return text


def localize(artist: Any, lang: str) -> Any:
    """Rewrite the labels of a matplotlib Figure or Axes in `lang` (in place); return it.
    Tick labels are left alone: they show numbers or the data's own tokens."""
    check_lang(lang)
    if lang == "en":
        return artist
    from matplotlib.axes import Axes
    from matplotlib.text import Text

    from attnkit.viz.fonts import use_cjk_font

    use_cjk_font()  # warns with the font to install when there is none
    data = set()  # tick labels (numbers, tokens) and texts marked gid="token" are data
    for ax in artist.findobj(Axes):
        for axis in (ax.xaxis, ax.yaxis):
            data.update(map(id, axis.get_ticklabels(which="both")))
    for text in artist.findobj(Text):
        words = text.get_text()
        if id(text) in data or text.get_gid() == "token" or not words:
            continue
        if translate(words, lang) != words:
            text.set_text(translate(words, lang))
    return artist
