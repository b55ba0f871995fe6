"""The tokenizers of `attnkit lm` (`attnkit.train.text_tokenizer`): exact round trips, the
saved state, determinism, and what they refuse."""

from __future__ import annotations

import pytest

from attnkit.train.text_tokenizer import CharTokenizer, from_state, train_tokenizer

DOCS = ["def main(x):\n    return x * 2\n\n", "class Cat:\n    '''猫 — ünïcode'''\n"] * 20


def test_characters_round_trip_and_name_what_they_cannot_encode():
    tok = train_tokenizer("char", DOCS)
    text = "".join(DOCS)
    assert tok.decode(tok.encode(text)) == text and tok.size == len(set(text))
    assert tok.unknown("Zx☃") == ["Z", "☃"]
    assert from_state(tok.state()).vocab == tok.vocab
    assert from_state(tok.vocab).vocab == tok.vocab  # checkpoints from before subwords


def test_byte_level_bpe_round_trips_any_text_and_is_deterministic():
    tok = train_tokenizer("bpe", DOCS, vocab_size=300)
    again = train_tokenizer("bpe", DOCS, vocab_size=300)
    assert tok.state() == again.state() and 256 < tok.size <= 300
    for text in ("".join(DOCS), "never seen: Zebra ☃ 😀\t\r\n", ""):
        assert tok.decode(tok.encode(text)) == text
        assert tok.unknown(text) == []
    ids = tok.encode("".join(DOCS))
    assert len(ids) < len("".join(DOCS)) / 2  # merges learnt: fewer tokens than characters
    loaded = from_state(tok.state())
    assert loaded.encode("def main(") == tok.encode("def main(") and loaded.size == tok.size


def test_bad_kinds_sizes_and_states_are_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        train_tokenizer("wordpiece", DOCS)
    with pytest.raises(ValueError, match="at least 257"):
        train_tokenizer("bpe", DOCS, vocab_size=100)
    for state in (None, {"kind": "char"}, {"kind": "bpe", "json": 3}, 5):
        with pytest.raises(ValueError, match="not a saved"):
            from_state(state)
    with pytest.raises(ValueError, match="does not load"):
        from_state({"kind": "bpe", "json": "{broken"})
    assert isinstance(from_state({"kind": "char", "vocab": "ab"}), CharTokenizer)
