"""No explanation of random weights (issue 28, item 2). `explain --checkpoint DIR` whose
config.json says gpt2 (or vit, with --image) over BERT weights exited 0 with a full
explanation: transformers started every weight it did not find from random numbers, with a
warning. Every checkpoint load now refuses weights that do not fit the config.json (exit 1,
one line naming the folder); a model type explain cannot read is named (exit 2). The heads
and poolers that stay tolerated are in tests/cli/test_explain_checkpoints.py."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed")

from attnkit.models import BertEncoder
from tests.hostile.cli import in_process, one_line
from tests.integrations.checkpoints import (
    save_text_checkpoint,
    save_vit_checkpoint,
)

TEXT = ["the cat sat", "--focus", "cat"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("ck")
    made = {f: save_text_checkpoint(f, root / f) for f in ("bert", "gpt2", "roberta")}
    made["vit"] = save_vit_checkpoint(root / "vit")
    return made


def _swap_config(tmp_path, weights, config_from, name):
    """`weights`' folder with `config_from`'s config.json (and tokenizer, for text)."""
    folder = tmp_path / name
    shutil.copytree(weights, folder)
    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special", "merges", "config")):
            f.unlink()
    for f in config_from.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special", "merges", "config")):
            shutil.copy(f, folder / f.name)
    return folder


def _explain(argv, capsys):
    capsys.readouterr()
    return in_process(["explain", *argv]), capsys.readouterr().err


def test_gpt2_config_over_bert_weights_is_refused(folders, tmp_path, capsys):
    folder = _swap_config(tmp_path, folders["bert"], folders["gpt2"], "gpt2_over_bert")
    code, err = _explain([*TEXT, "--checkpoint", folder, "--out", tmp_path / "o"], capsys)
    one_line(code, err, 1, str(folder), "'gpt2'", "missing", "unexpected", "random")
    assert not list((tmp_path / "o").glob("*"))  # nothing explained, nothing written


def test_vit_config_over_bert_weights_is_refused(folders, tmp_path, capsys):
    from PIL import Image

    folder = _swap_config(tmp_path, folders["bert"], folders["vit"], "vit_over_bert")
    Image.new("RGB", (20, 20), (90, 40, 10)).save(tmp_path / "a.png")
    argv = ["--checkpoint", folder, "--image", tmp_path / "a.png", "--out", tmp_path / "o"]
    code, err = _explain(argv, capsys)
    one_line(code, err, 1, str(folder), "'vit'", "missing", "unexpected")
    assert not list((tmp_path / "o").glob("*"))


def test_bert_config_over_gpt2_weights_is_refused_by_attnkits_own_loader(folders, tmp_path, capsys):
    folder = _swap_config(tmp_path, folders["gpt2"], folders["bert"], "bert_over_gpt2")
    code, err = _explain([*TEXT, "--checkpoint", folder, "--out", tmp_path / "o"], capsys)
    one_line(code, err, 1, str(folder / "model.safetensors"), "missing", "unexpected")
    from attnkit.models.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=r"model\.safetensors: the weights do not fit"):
        BertEncoder.from_pretrained(folder)


def test_a_tensor_of_no_part_of_the_model_is_refused(folders, tmp_path, capsys):
    """One stray tensor too many: the file is not the checkpoint config.json describes."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "extra"
    shutil.copytree(folders["bert"], folder)
    state = load_file(folder / "model.safetensors")
    state["encoder.layer.0.attention.self.rotary.weight"] = torch.zeros(4)
    save_file(state, folder / "model.safetensors")
    code, err = _explain([*TEXT, "--checkpoint", folder, "--out", tmp_path / "o"], capsys)
    one_line(code, err, 1, "1 unexpected tensors", "rotary")


def test_library_loader_refuses_too(folders, tmp_path):
    from attnkit.integrations.transformers import load_model
    from attnkit.models.checkpoint import CheckpointError

    folder = _swap_config(tmp_path, folders["bert"], folders["gpt2"], "gpt2_over_bert")
    with pytest.raises(CheckpointError, match=r"gpt2_over_bert': the weights do not fit.*'gpt2'"):
        load_model(folder)
    assert isinstance(CheckpointError("x"), ValueError)  # callers catching ValueError still do


def test_a_model_type_explain_cannot_read_is_named(folders, tmp_path, capsys):
    import transformers

    t5 = tmp_path / "t5"
    shutil.copytree(folders["gpt2"], t5)
    transformers.T5Config(d_model=32, num_layers=1, num_heads=4, d_ff=64, d_kv=8).save_pretrained(
        t5
    )
    code, err = _explain([*TEXT, "--checkpoint", t5], capsys)
    one_line(code, err, 2, "'t5'", "encoder-decoder")
    mystery = tmp_path / "mystery"
    shutil.copytree(folders["bert"], mystery)
    data = json.loads((mystery / "config.json").read_text())
    (mystery / "config.json").write_text(json.dumps({**data, "model_type": "mystery-net"}))
    code, err = _explain([*TEXT, "--checkpoint", mystery], capsys)
    one_line(code, err, 2, "'mystery-net'", "--checkpoint")
