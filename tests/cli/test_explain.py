"""`attnkit explain`: bad input exits 2 with one line; a good run prints a table and writes files.

Most runs use a tiny random BERT (width 32, the real tokenizer) so they take well
under a second; one subprocess run uses the embedded all-MiniLM-L6-v2.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from attnkit.cli import explain
from attnkit.cli._render import FILES
from attnkit.cli.main import main
from attnkit.models import default_checkpoint
from attnkit.viz import AttentionMaps

TINY = {
    "model_type": "bert",
    "vocab_size": 30522,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 24,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random BERT folder with the real tokenizer files, max 24 positions."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    transformers.BertModel(transformers.BertConfig(**TINY)).save_pretrained(folder)
    for name in ("tokenizer.json", "vocab.txt"):
        shutil.copy(default_checkpoint() / name, folder / name)
    return folder


def _fails(capsys, argv, *expected):
    assert main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnkit explain: error: "), err
    for part in expected:
        assert part in lines[0], lines[0]
    assert "Traceback" not in err
    return lines[0]


def _out_args(tmp_path):
    out = tmp_path / "out"
    return out, ["--out", str(out)]


def test_empty_text(capsys, tmp_path):
    out, args = _out_args(tmp_path)
    _fails(capsys, ["  ", *args], "TEXT is empty")
    assert not out.exists()


def test_missing_checkpoint_dir(capsys, tmp_path):
    out, args = _out_args(tmp_path)
    _fails(
        capsys, ["--checkpoint", str(tmp_path / "nope"), *args], "does not exist", "--checkpoint"
    )
    assert not out.exists()


def test_checkpoint_without_weights(capsys, tmp_path, tiny):
    folder = tmp_path / "partial"
    folder.mkdir()
    shutil.copy(tiny / "config.json", folder / "config.json")
    _fails(capsys, ["--checkpoint", str(folder)], "has no weights", "model.safetensors")


def test_unknown_model_type(capsys, tmp_path, tiny):
    """Not BERT: read through transformers, which knows no such model (RoBERTa, GPT-2, ...
    are tested in test_explain_checkpoints.py)."""
    folder = tmp_path / "mystery"
    shutil.copytree(tiny, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "mystery-net"}))
    _fails(capsys, ["--checkpoint", str(folder)], "cannot load", "mystery")


def test_text_longer_than_max_positions(capsys, tmp_path, tiny):
    out, args = _out_args(tmp_path)
    line = _fails(capsys, ["it " * 30, "--checkpoint", str(tiny), *args], "32 tokens", "at most 24")
    assert "TEXT has" in line
    assert not out.exists()


def test_focus_not_in_text(capsys, tmp_path, tiny):
    out, args = _out_args(tmp_path)
    _fails(
        capsys,
        ["The cat sat.", "--focus", "dog", "--checkpoint", str(tiny), *args],
        "--focus 'dog' is not in the text",
        "the cat sat .",
    )
    assert not out.exists()


def test_layer_out_of_range(capsys, tiny):
    _fails(capsys, ["--layers", "2", "--checkpoint", str(tiny)], "--layers 2", "2 layers (0..1)")


def test_out_is_a_file(capsys, tmp_path):
    target = tmp_path / "file"
    target.write_text("keep me")
    _fails(capsys, ["--out", str(target)], "is a file")
    assert target.read_text() == "keep me"


def test_find_focus_uses_word_pieces():
    tokens = ["[CLS]", "the", "animal", "didn", "'", "t", "go", "[SEP]"]
    pieces = {"didn't": ["didn", "'", "t"], "It": ["it"]}
    assert explain.find_focus(tokens, "ANIMAL", pieces.get) == 2
    assert explain.find_focus(tokens, "didn't", pieces.get) == 3


def test_ranked_renormalises_without_skipped():
    row = torch.tensor([0.5, 0.3, 0.2])
    assert explain.ranked(row, ["a", "b", "c"], 1) == [("a", 0.5)]
    (token, weight), *_ = explain.ranked(row, ["a", "b", "c"], 2, skip=[0])
    assert token == "b" and weight == pytest.approx(0.6)


def test_good_run_prints_table_and_writes_files(capsys, tmp_path, tiny):
    out, args = _out_args(tmp_path)
    argv = ["the cat sat", "--pair", "it slept", "--focus", "it", "--top", "2"]
    assert main(["explain", *argv, "--heads", "1", "3", "--checkpoint", str(tiny), *args]) == 0
    stdout = capsys.readouterr().out
    assert "where 'it' (token 5) attends" in stdout and "head" in stdout
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("attnkit explain: wrote head_view.html, model_view.png, ")
    data = json.loads((out / "attention.json").read_text())
    assert data["shape"] == [2, 2, 8, 8] and data["tokens"][5] == "it"
    assert AttentionMaps.from_json_dict(data).tokens == data["tokens"]
    assert data["explain"]["heads"] == [1, 3]
    assert (out / "model_view.png").read_bytes()[:4] == b"\x89PNG"
    assert "<html" in (out / "head_view.html").read_text().lower()
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)  # no temporary files left
    assert (out / "head_distance.png").read_bytes()[:4] == b"\x89PNG"
    assert len(data["head_stats"]["distance_tokens"]) == 2  # layers x heads shown
    assert "layer 1: distance" in stdout


def test_default_run_in_a_subprocess(tmp_path):
    out = tmp_path / "explain"
    run = subprocess.run(
        [sys.executable, "-m", "attnkit", "explain", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "where 'it' (token 10) attends" in run.stdout
    assert "layer 5: head 11 puts the most weight of 'it' on one word: 0.65 on 'animal'" in (
        run.stdout
    )
    assert "what the heads do" in run.stdout and "layer 5: distance" in run.stdout
    data = json.loads((out / "attention.json").read_text())
    assert data["shape"] == [6, 12, 15, 15]
    assert {p.name for p in out.iterdir()} == set(FILES)


def test_readme_example_with_ranges_and_json(capsys, tmp_path):
    """The README's `--layers 3-5 --heads 0,11`, on the embedded model; --json is all of stdout."""
    out = tmp_path / "readme"
    argv = ["explain", "The cat sat.", "--focus", "cat", "--layers", "3-5", "--heads", "0,11"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)  # one JSON document, nothing else
    assert summary["layers"] == [3, 4, 5] and summary["heads"] == [0, 11]
    assert summary["focus"] == {"token": "cat", "index": 2}
    assert sorted(summary["files"]) == sorted(str(out / n) for n in FILES)
    assert main([*argv, "--out", str(out)]) == 2  # results there: refused without --force
    assert "--force" in capsys.readouterr().err
    assert main([*argv, "--out", str(out), "--force", "--quiet"]) == 0
    assert capsys.readouterr().out.strip().splitlines() == [
        f"attnkit explain: wrote {', '.join(FILES)} to {out}/"
    ]


def test_default_run_imports_only_what_it_needs(tmp_path):
    """The slow imports `attnkit explain` used to pay for nothing: matplotlib (its PNGs are
    drawn with Pillow), sympy (pulled in by torch's symbolic shape checks), torch._dynamo
    (pulled in by initialising weights on the meta device) and transformers (BERT runs on
    attnkit's own encoder)."""
    code = f"""
import sys
from attnkit.cli.main import main
assert main(["explain", "--out", {str(tmp_path / "out")!r}, "--quiet"]) == 0
heavy = ("matplotlib", "sympy", "torch._dynamo", "transformers")
print("heavy:" + ",".join(m for m in heavy if m in sys.modules))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "heavy:"
    assert {p.name for p in (tmp_path / "out").iterdir()} == set(FILES)
