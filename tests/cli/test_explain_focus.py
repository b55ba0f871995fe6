"""`attnkit explain` without --focus works on any text: the first pronoun, else the last word,
and stderr says which (issue 30: the main command failed on the first sentence typed)."""

from __future__ import annotations

import json

import pytest

from attnkit.cli._errors import UsageError
from attnkit.cli._explain_hf import pick_focus
from attnkit.cli.main import main
from tests.cli.test_explain import tiny  # noqa: F401  (the fixture)
from tests.cli.test_explain_checkpoints import FAMILIES, folders  # noqa: F401  (the fixture)

# twenty sentences without "it": pronouns elsewhere, none at all, punctuation, digits, casing
SENTENCES = [
    ("The cat sat on the mat.", "mat"),
    ("Dogs bark at night", "night"),
    ("She sold sea shells by the shore.", "she"),
    ("My brother said he would come back later", "he"),
    ("They walked home together after the game.", "they"),
    ("A quick brown fox jumps over the lazy dog!", "dog"),
    ("Paris is the capital of France", "france"),
    ("The results were better than expected...", "expected"),
    ("Alice gave Bob her book", "her"),
    ("We need 42 chairs", "we"),
    ("The committee approved the budget; members cheered.", "cheered"),
    ("Attention is all you need", "need"),
    ("The stock rose 3%", "3"),
    ("Tell them the truth", "them"),
    ("Rain fell all day", "day"),
    ("Where is the station?", "station"),
    ("The teacher praised his students", "his"),
    ("HELLO WORLD", "world"),
    ("Birds migrate south in winter, returning in spring.", "spring"),
    ("The model learned quickly", "quickly"),
]


def test_the_rule_first_pronoun_else_last_word():
    words = [("The", 1), ("animal", 2), ("saw", 3), ("its", 4), ("owner", 5), ("it", 6)]
    assert pick_focus(words) == (4, "the text's first pronoun")
    assert pick_focus([("Cats", 1), ("purr", 2), (".", 3)]) == (
        2,
        "the text's last word (it has no pronoun)",
    )
    with pytest.raises(UsageError, match="TEXT has no word"):
        pick_focus([("...", 1), ("!", 2)])


@pytest.mark.parametrize(("text", "word"), SENTENCES)
def test_twenty_sentences_without_it(text, word, tiny, tmp_path, capsys):  # noqa: F811
    argv = ["explain", text, "--checkpoint", str(tiny), "--out", str(tmp_path), "--json"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["focus"]["token"] == word
    assert f"attnkit explain: showing {word!r}, the text's " in cap.err


def test_a_given_focus_is_still_checked(tiny, tmp_path, capsys):  # noqa: F811
    argv = ["explain", "The cat sat.", "--focus", "dog", "--checkpoint", str(tiny)]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert "--focus 'dog' is not in the text" in capsys.readouterr().err


@pytest.mark.parametrize("family", FAMILIES)
def test_other_families_pick_the_same_way(family, folders, tmp_path, capsys):  # noqa: F811
    argv = ["explain", "Dogs bark at night.", "--checkpoint", str(folders[family])]
    assert main([*argv, "--out", str(tmp_path), "--json"]) == 0
    cap = capsys.readouterr()
    # the first token of the last word (these test tokenizers split words into letters)
    token = json.loads(cap.out)["focus"]["token"].strip().lower()
    assert token and "night".startswith(token)
    assert "showing" in cap.err and "last word" in cap.err
