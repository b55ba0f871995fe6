"""Token labels in every picture and printout: byte-level BPE ("Ġcat", "Ċ") and SentencePiece
("▁the") shown the way WordPiece is (a word's first piece bare, the rest "##")."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.viz import AttentionMaps, head_view, show, token_labels
from attnkit.viz.head_view import _encode
from attnkit.viz.raster import pool_tokens

# GPT-2's tokens of "<|endoftext|>The unbelievable cat sat.\n\n  café" (as its tokenizer
# writes them: "Ġ" a space, "Ċ" a newline, "Ã©" the two bytes of "é")
GPT2 = ["<|endoftext|>", "The", "Ġun", "bel", "ievable", "Ġcat", "Ġsat", ".", "ĊĊ", "Ġ",
        "Ġcaf", "Ã©"]  # fmt: skip
SHOWN = ["<|endoftext|>", "The", "un", "##bel", "##ievable", "cat", "sat", ".", "↵↵", "␣",
         "caf", "##é"]  # fmt: skip
MARKS = ("Ġ", "Ċ", "ĉ", "\\u0120", "\\u010a")  # raw, or escaped inside JSON


def _no_marks(text: str) -> bool:
    return not any(m in text for m in MARKS)


def test_byte_level_pieces_read_as_wordpiece_does():
    assert token_labels(GPT2) == SHOWN
    assert token_labels(["Ġcat"]) == ["cat"]
    # WordPiece shows the same words the same way: first piece bare, the others "##"
    assert token_labels(["[CLS]", "the", "un", "##bel", "##ievable", "cat", "[SEP]"]) == [
        "[CLS]", "the", "un", "##bel", "##ievable", "cat", "[SEP]"
    ]  # fmt: skip
    # SentencePiece: "▁" starts a word
    assert token_labels(["<s>", "▁The", "▁un", "believ", "able", "▁cat"]) == [
        "<s>", "The", "un", "##believ", "##able", "cat"
    ]  # fmt: skip
    assert token_labels(SHOWN) == SHOWN  # labels already shown stay as they are
    assert token_labels(["hello", "world"]) == ["hello", "world"]  # plain words
    assert token_labels(["Ġa", "Ġtab", "ĉ", "ĠâĺĥĠ"]) == ["a", "tab", "⇥", "☃␣"]
    # a special token named by the tokenizer, whatever it looks like, stays and starts a word
    assert token_labels(["SEP", "Ġa", "b"], [True, False, False]) == ["SEP", "a", "##b"]
    with pytest.raises(ValueError, match="special: wanted 3 flags, one per token, got 2"):
        token_labels(["Ġa", "b", "c"], [False, False])


def _bpe():
    """A byte-level BPE tokenizer trained here (offline), as GPT-2's is built."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.ByteLevelBPETokenizer()
    corpus = ["The cat sat on the mat.\nIt was unbelievably tired, said the café owner."] * 8
    tok.train_from_iterator([*corpus, "naïve 東京 🙂 tab\there"], vocab_size=400)
    return tok


def test_each_piece_reads_as_the_tokenizer_decodes_it():
    tok = _bpe()
    checked = 0
    for piece, i in tok.get_vocab().items():
        text = tok.decode([i])
        if "\ufffd" in text:  # part of a character's bytes: no text of its own
            continue
        [label] = token_labels([piece])
        word = text[1:] if text.startswith(" ") and text.strip() else text
        word = word.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "↵")
        word = "".join(f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c for c in word)
        assert label == word, piece
        checked += 1
    assert checked > 150  # the others are single bytes of longer characters


def test_pieces_of_a_text_join_back_into_its_words():
    tok = _bpe()
    text = "The cat sat on the unbelievably tired mat, naïve owner 🙂"
    labels = token_labels(tok.encode(text).tokens)
    assert _no_marks("".join(labels)) and len(labels) > len(text.split())
    assert labels[-1] == "🙂"  # the emoji's 4 bytes over 4 pieces: the last one shows it
    assert labels[-4:-1] == ["<0xF0>", "<0x9F>", "<0x99>"]
    words, current = [], ""
    for label in labels:
        if label.startswith("<0x") or label == "␣":  # bytes of a character; a lone space
            continue
        if label.startswith("##"):
            current += label[2:]
        else:
            words.append(current) if current else None
            current = label
    words.append(current)
    # every word of the text is one or more pieces; its punctuation is a word of its own
    assert words == text.replace(",", " ,").split()


def _maps(tokens):
    g = torch.Generator().manual_seed(0)
    n = len(tokens)
    maps = torch.rand(2, 3, n, n, generator=g).softmax(-1)  # (L, H, N, N)
    return AttentionMaps(tokens, maps)


def test_head_view_and_notebook_show_labels():
    maps = _maps(GPT2)
    payload = _encode(maps, max_tokens=512, top_k=10, threshold=0.02)
    assert payload["tokens"] == SHOWN and payload["keyTokens"] == SHOWN
    assert _encode(maps, max_tokens=5, top_k=10, threshold=0.02)["tokens"] == SHOWN[:5]
    assert _no_marks(head_view(maps)) and _no_marks(show(maps).html)
    assert maps.tokens == GPT2  # the data keeps the tokenizer's strings


def test_pictures_label_their_axes_with_the_labels():
    pytest.importorskip("matplotlib")
    from attnkit.viz import model_view

    maps = _maps(GPT2)
    fig = model_view(maps)
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
    assert "cat" in ticks and "##ievable" in ticks and _no_marks("".join(ticks))
    _, labels, block = pool_tokens(maps.maps, maps.tokens, dim=2, max_blocks=64, op="mean")
    assert labels == SHOWN and block == 1
    _, pooled, block = pool_tokens(maps.maps, maps.tokens, dim=2, max_blocks=4, op="mean")
    assert block == 3 and pooled[1] == "3–5 ##bel…" and _no_marks("".join(pooled))


def test_layer_view_and_head_lines_show_labels():
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from attnkit.viz import draw_head_lines, layer_view

    maps = _maps(GPT2)
    fig = layer_view(maps, 0)
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
    assert "cat" in ticks and "##ievable" in ticks and _no_marks("".join(ticks))
    ax = Figure().add_subplot()
    draw_head_lines(ax, maps, 0, 0, query="Ġcat")  # the query is named by its raw token
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("cat") == 2 and _no_marks("".join(texts))


def test_explain_on_a_byte_level_checkpoint_prints_and_draws_labels(tmp_path, capsys):
    pytest.importorskip("transformers")
    from attnkit.cli.main import main
    from tests.integrations.checkpoints import save_text_checkpoint

    folder = save_text_checkpoint("gpt2", tmp_path / "gpt2")
    text = "The cat sat on the mat.\nIt was tired."
    assert main(["explain", text, "--checkpoint", str(folder), "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert _no_marks(printed) and "##at" in printed  # its tiny vocabulary: "Ġc", "at"
    shown = json.loads((tmp_path / "o" / "attention.json").read_text())["tokens"]
    assert shown[:3] == ["The", "c", "##at"] and "↵" in shown
    assert _no_marks(json.dumps(shown))
    assert _no_marks((tmp_path / "o" / "head_view.html").read_text())
