"""`attnkit explain` on Chinese text with the embedded (English) model (issue 38, item 2): the
default focus is a word the model can read, `--focus 它` is refused with the reason, the table
lines up with double-width characters, and the head view opens on the focus word at the layer
and head the printout names."""

from __future__ import annotations

import json
import re

import pytest

from attnkit.cli._errors import UsageError
from attnkit.cli._explain_hf import pick_focus
from attnkit.cli._explain_report import display_width, ljust
from attnkit.cli.main import main

CAT = "我的猫昨天在花园里抓到了一只老鼠，它很高兴。"
ANIMAL = "动物没有过马路，因为它太累了"


def test_display_width_counts_wide_characters_twice():
    assert display_width("cat") == 3
    assert display_width("猫") == 2
    assert display_width("高 0.16") == 7
    assert display_width("，") == 2  # full-width comma
    assert display_width("é") == 1 and display_width("e\u0301") == 1  # combining accent
    assert display_width(ljust("猫 0.5", 10)) == 10
    assert ljust("a much longer text", 4) == "a much longer text"


def test_default_focus_skips_unknown_words_and_says_why():
    words = [("我", 1), ("的", 2), ("[UNK]", 3), ("，", 4), ("[UNK]", 5), ("高", 6), ("[UNK]", 7)]
    index, why = pick_focus(words, unknown=["猫", "它", "兴"])
    assert index == 6
    assert "'它' reads as the unknown token" in why
    assert pick_focus([("我", 1), ("它", 2), ("高", 3)]) == (2, "the text's first pronoun")
    index, why = pick_focus([("a", 1), ("[UNK]", 2)], unknown=["猫"])
    assert index == 1 and why == "the text's last word the model can read"
    with pytest.raises(UsageError, match="that the model can read"):
        pick_focus([("[UNK]", 1), ("[UNK]", 2)], unknown=["猫", "狗"])


def _char_at(line: str, column: int) -> str:
    """The character at display column `column` of `line` ("" past its end)."""
    at = 0
    for c in line:
        if at >= column:
            return c
        at += display_width(c)
    return ""


def test_chinese_sentence_on_the_embedded_model(tmp_path, capsys):
    assert main(["explain", CAT, "--out", str(tmp_path)]) == 0
    cap = capsys.readouterr()
    shown = re.search(r"showing '(.)', the text's last word the model can read", cap.err)
    assert shown, cap.err
    assert "'它' reads as the unknown token" in cap.err
    assert "244 Chinese characters" in cap.out  # what the embedded model cannot read
    lines = cap.out.splitlines()
    # every row of both tables starts its last column where the header says
    for header_start in ("layer  top tokens", " head  top token"):
        h = next(i for i, line in enumerate(lines) if line.startswith(header_start))
        header = lines[h]
        column = header.index("top word")  # ASCII header: index == display column
        rows = lines[h + 1 : lines.index("", h)]
        assert rows and any(display_width(r) != len(r) for r in rows)  # CJK in the rows
        for row in rows:
            assert _char_at(row, column - 2) == " " and _char_at(row, column - 1) == " ", row
            assert _char_at(row, column) not in ("", " "), row
    # the head view opens on the focus word, at the layer and head the printout names
    named = re.search(r"layer (\d+): head (\d+) puts the most weight of '(.)'", cap.out)
    assert named and named.group(3) == shown.group(1)
    html = (tmp_path / "head_view.html").read_text("utf-8")
    data = json.loads(re.search(r'id="ak-data">(.*?)</script>', html, re.S).group(1))
    assert data["tokens"][data["initialQuery"]] == shown.group(1)
    assert (data["initialLayer"], data["initialHead"]) == (int(named[1]), int(named[2]))
    assert "@font-face" in html  # the page's Chinese glyphs travel with it


def test_focus_on_a_character_the_model_cannot_read_is_refused(tmp_path, capsys):
    assert main(["explain", ANIMAL, "--focus", "它", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'它' has characters the model's vocabulary lacks" in err
    assert "[UNK]" in err and "--checkpoint" in err


def test_the_classic_chinese_example_focuses_a_readable_word(tmp_path, capsys):
    assert main(["explain", ANIMAL, "--out", str(tmp_path), "--json"]) == 0
    focus = json.loads(capsys.readouterr().out)["focus"]["token"]
    assert focus == "太"  # 它 and 累 read as [UNK]; 太 is the last character the model knows


def test_without_a_cjk_font_one_line_names_the_font_to_install(tmp_path, capsys, monkeypatch):
    from attnkit.viz import fonts

    monkeypatch.setattr(fonts, "cjk_font_file", lambda: None)
    assert main(["explain", "猫 and a cat", "--out", str(tmp_path), "--quiet"]) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if "no CJK font found" in line]
    assert len(warning) == 1 and "pip install noto-cjk-sans-otc" in warning[0]
    assert "fonts-noto-cjk" in warning[0]
    assert "@font-face" not in (tmp_path / "head_view.html").read_text("utf-8")
    # an English text needs no CJK font and hears nothing about one
    assert main(["explain", "a cat", "--out", str(tmp_path / "en"), "--quiet"]) == 0
    assert "CJK" not in capsys.readouterr().err
