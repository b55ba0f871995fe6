"""`attnkit explain --checkpoint DIR` for every family: random-weight models saved with their
tokenizer to a temporary folder and loaded back by path, like a user's checkpoint."""

from __future__ import annotations

import json
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed")

from attnkit.cli import _explain_hf
from attnkit.cli._errors import UsageError
from attnkit.cli.main import main
from attnkit.viz import AttentionMaps
from tests.integrations.checkpoints import (
    DECODERS,
    FAMILIES,
    save_text_checkpoint,
    save_vit_checkpoint,
)

TEXT = "The animal didn't cross the street because it was too tired"
BYTE_LEVEL = ("roberta", "gpt2")  # every character is representable


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: save_text_checkpoint(f, root / f) for f in FAMILIES}


def _explain(capsys, *argv):
    code = main(["explain", *map(str, argv), "--json"])
    captured = capsys.readouterr()
    return code, captured


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_runs_by_path_and_writes_the_usual_files(family, folders, tmp_path, capsys):
    out = tmp_path / "out"
    code, cap = _explain(capsys, TEXT, "--checkpoint", folders[family], "--out", out)
    assert code == 0, cap.err
    summary = json.loads(cap.out)  # --json: one document, nothing else on stdout
    assert summary["decoder"] == (family in DECODERS)
    assert summary["unknown"] == []
    assert summary["focus"]["token"].lower() == "it"
    data = json.loads((out / "attention.json").read_text())
    maps = AttentionMaps.from_json_dict(data).maps  # (L, H, N, N)
    n = len(data["tokens"])
    assert maps.shape == (2, 4, n, n)
    rows = maps.sum(-1)  # (L, H, N); the JSON rounds each weight
    torch.testing.assert_close(rows, torch.ones(2, 4, n), atol=2e-3, rtol=0)
    above = float(maps.triu(diagonal=1).abs().max())
    if family in DECODERS:  # the causal picture: no weight above the diagonal, anywhere
        assert above == 0.0
    else:
        assert above > 0.01
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["attention.json", "head_distance.png", "head_view.html", "model_view.png"]
    )
    assert "Ġ" not in "".join(data["tokens"]) and "▁" not in "".join(data["tokens"])


def test_bert_folder_keeps_attnkits_own_encoder(folders):
    assert _explain_hf.checkpoint_kind(folders["bert"]) == "bert"
    assert {_explain_hf.checkpoint_kind(folders[f]) for f in FAMILIES if f != "bert"} == {"hf"}
    assert _explain_hf.checkpoint_kind(None) == "bert"


@pytest.mark.parametrize("family", FAMILIES)
def test_focus_resolves_a_word_split_into_pieces(family, folders, tmp_path, capsys):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folders[family])
    word = "attnkitting"
    assert len(tok.tokenize(" " + word)) > 1  # really split, in every family
    text = f"we are {word} today"
    code, cap = _explain(
        capsys, text, "--focus", word.upper(), "--checkpoint", folders[family], "--out", tmp_path
    )
    assert code == 0, cap.err
    focus = json.loads(cap.out)["focus"]
    first = tok(text)["input_ids"]
    pieces = tok.convert_ids_to_tokens(first)
    assert len(pieces) > focus["index"]
    start = tok.convert_tokens_to_string([pieces[focus["index"]]]).strip().replace("##", "")
    assert start and word.startswith(start.lower())
    before = tok.convert_tokens_to_string(pieces[: focus["index"]])
    assert word not in before and before.strip().endswith("are")


@pytest.mark.parametrize("family", FAMILIES)
def test_unrepresentable_text_is_reported_not_silently_attended(family, folders, tmp_path, capsys):
    argv = ["the cat ☃ sat", "--focus", "cat", "--checkpoint", folders[family]]
    code, cap = _explain(capsys, *argv, "--out", tmp_path / "a")
    assert code == 0, cap.err
    unknown = json.loads(cap.out)["unknown"]
    assert unknown == ([] if family in BYTE_LEVEL else ["☃"])
    assert main(["explain", *map(str, argv), "--out", str(tmp_path / "b")]) == 0
    printed = capsys.readouterr().out
    assert ("cannot represent '☃'" in printed) == (family not in BYTE_LEVEL)


@pytest.mark.parametrize("family", ["bert", "distilbert", "llama"])
def test_focus_on_an_unrepresentable_character_is_refused(family, folders, tmp_path, capsys):
    argv = ["the cat ☃ sat", "--focus", "☃", "--checkpoint", str(folders[family])]
    assert main(["explain", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "cannot represent" in err or "vocabulary lacks" in err
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize("family", FAMILIES)
def test_focus_absent_lists_the_words(family, folders, tmp_path, capsys):
    argv = ["The cat sat.", "--focus", "dog", "--checkpoint", str(folders[family])]
    assert main(["explain", *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--focus 'dog' is not in the text" in err
    assert "cat" in err and "sat" in err.split("text")[-1]
    assert not (tmp_path / "o").exists()


def test_find_word_across_sub_word_marks():
    words = [("The", 1), ("animal", 2), ("didn't", 4), ("tired.", 9)]
    tokens = ["<s>", "The", "Ġanimal", "Ġdid", "n't", "Ġtired", "."]
    assert _explain_hf.find_word("ANIMAL", words, tokens) == 2
    assert _explain_hf.find_word("didn't", words, tokens) == 4
    assert _explain_hf.find_word("tired", words, tokens) == 9  # punctuation around a word
    assert _explain_hf.find_word(".", words, tokens) == 6  # a token that is no word
    assert _explain_hf.find_word("<s>", words, tokens) == 0
    with pytest.raises(UsageError, match=r"its words are: The animal didn.t tired\."):
        _explain_hf.find_word("cat", words, tokens)


def test_words_from_marks_of_each_family():
    from attnkit.integrations.transformers import _words_from_marks

    wordpiece = ["[CLS]", "the", "att", "##nk", "##it", "sat", "[SEP]"]
    assert _words_from_marks(wordpiece, [True] + [False] * 5 + [True]) == [
        ("the", 1),
        ("attnkit", 2),
        ("sat", 5),
    ]
    bpe = ["The", "Ġatt", "nk", "it", "Ġsat"]
    assert _words_from_marks(bpe, [False] * 5) == [("The", 0), ("attnkit", 1), ("sat", 4)]
    sp = ["<s>", "▁the", "▁att", "nkit"]
    assert _words_from_marks(sp, [True, False, False, False]) == [("the", 1), ("attnkit", 2)]


def test_layers_and_heads_are_checked_against_the_config(folders, capsys):
    argv = ["explain", "--checkpoint", str(folders["gpt2"])]
    assert main([*argv, "--layers", "2"]) == 2
    assert "--layers 2 is out of range: the model has 2 layers" in capsys.readouterr().err
    assert main([*argv, "--heads", "4"]) == 2
    assert "the model has 4 heads" in capsys.readouterr().err


def test_text_longer_than_the_positions_is_refused(folders, tmp_path, capsys):
    import transformers

    folder = tmp_path / "short"
    save_text_checkpoint("gpt2", folder)
    config = transformers.AutoConfig.from_pretrained(folder)
    config.n_positions = 8
    config.save_pretrained(folder)
    assert main(["explain", "it " * 20, "--checkpoint", str(folder), "--out", str(tmp_path)]) == 2
    assert "at most 8 (max_position_embeddings)" in capsys.readouterr().err


def test_without_transformers_one_line_names_the_extra(folders, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    argv = ["explain", "--checkpoint", str(folders["roberta"]), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "'roberta' checkpoint" in err and "pip install '.[hf]' in a clone of https://" in err
    assert not (tmp_path / "o").exists()


# --- ViT: the explain-image pictures for an --image ---


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    return save_vit_checkpoint(tmp_path_factory.mktemp("vit"))


@pytest.fixture
def picture(tmp_path):
    from PIL import Image

    path = tmp_path / "digit.png"
    pixels = bytes((x * 16 + y * 3) % 256 for y in range(20) for x in range(20))
    Image.frombytes("L", (20, 20), pixels).save(path)
    return path


def test_vit_needs_an_image(vit, tmp_path, capsys):
    assert main(["explain", "--checkpoint", str(vit), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "is an image model ('vit')" in err and "--image FILE" in err
    assert not (tmp_path / "o").exists()


def test_vit_with_an_image_writes_the_explain_image_pictures(vit, picture, tmp_path, capsys):
    out = tmp_path / "o"
    code, cap = _explain(capsys, "--checkpoint", vit, "--image", picture, "--out", out)
    assert code == 0, cap.err
    summary = json.loads(cap.out)
    assert sorted(summary["files"]) == sorted(
        str(out / n) for n in ("attention.png", "head_distance.png")
    )
    for name in ("attention.png", "head_distance.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_vit_refuses_a_file_that_is_no_image(vit, tmp_path, capsys):
    bad = tmp_path / "notes.png"
    bad.write_text("not a picture")
    argv = ["explain", "--checkpoint", str(vit), "--image", str(bad), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "is not an image file" in capsys.readouterr().err


def test_image_with_a_text_checkpoint_is_refused(folders, picture, capsys):
    assert main(["explain", "--checkpoint", str(folders["gpt2"]), "--image", str(picture)]) == 2
    assert "--image is for image checkpoints" in capsys.readouterr().err


def test_heads_and_pooler_that_explain_does_not_use_are_tolerated(folders, tmp_path, capsys):
    """Weights that do not fit config.json are refused (tests/hostile/test_random_weights.py),
    but not a task head or a pooler: explain reads neither."""
    import shutil

    import transformers

    from tests.integrations.checkpoints import config

    # a masked-LM RoBERTa: lm_head.* unexpected and the pooler missing for the base model
    roberta = tmp_path / "roberta_mlm"
    shutil.copytree(folders["roberta"], roberta)
    torch.manual_seed(0)
    vocab = json.loads((roberta / "config.json").read_text())["vocab_size"]
    transformers.RobertaForMaskedLM(config("roberta", vocab)).save_pretrained(roberta)
    # a BERT classifier (classifier.*, bert. prefix) read by attnkit's own encoder
    bert = tmp_path / "bert_cls"
    shutil.copytree(folders["bert"], bert)
    transformers.BertForSequenceClassification(config("bert", 30522)).save_pretrained(bert)
    for folder in (roberta, bert):
        code, cap = _explain(capsys, TEXT, "--checkpoint", folder, "--out", tmp_path / folder.name)
        assert code == 0, cap.err
