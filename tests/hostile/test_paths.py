"""Paths named for what they are, refused before work starts (issue 39).

Before: `lm train --text` given a folder, /dev/zero or a FIFO, and `explain --image` given a
folder, said "no such file" / "does not exist"; an --out that is a symlink loop or a dangling
symlink said "a part of the path is a file"; a newline inside --out was accepted and split
the summary's last line in two; `lm train --resume` on a truncated checkpoint failed with
"failed: RuntimeError: PytorchStreamReader ..." where `lm sample` named the file as not
readable; a pickled pytorch_model.bin printed torch's UserWarning before the refusal;
`flops --plot --dim 100000` failed in torch's allocator."""

from __future__ import annotations

import io
import json
import os
import pickle

import pytest
import torch

from tests.hostile.cli import attnkit, in_process, one_line
from tests.hostile.test_cli_holes import LM_TINY, S2S_TINY, TEXT


@pytest.fixture
def odd(tmp_path, monkeypatch):
    """A folder of paths that are not regular files, and a text file to train on."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_text(TEXT)
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    os.symlink("loop", tmp_path / "loop")
    os.symlink("nowhere", tmp_path / "dangling")
    return tmp_path


NOT_FILES = {
    "dir": "is a folder",
    "/dev/zero": "is a device",
    "fifo": "is a FIFO",
    "loop": "is a symlink loop",
    "dangling": "is a dangling symlink (to 'nowhere')",
}


@pytest.mark.parametrize("path", sorted(NOT_FILES))
def test_text_that_is_not_a_file_is_named(path, odd, capsys):
    code = in_process(["lm", "train", "--text", path, *LM_TINY, "--out", "run"])
    one_line(code, capsys.readouterr().err, 2, "--text", NOT_FILES[path])
    assert not (odd / "run").exists()


def test_an_image_that_is_a_folder_is_named(odd, capsys):
    (odd / "vit").mkdir()  # an image checkpoint as far as --image's check reads it
    (odd / "vit" / "config.json").write_text(json.dumps({"model_type": "vit"}))
    code = in_process(["explain", "--checkpoint", "vit", "--image", "dir", "--out", "o"])
    one_line(code, capsys.readouterr().err, 2, "--image", "is a folder")


OUT_COMMANDS = {
    "lm train": ["lm", "train", "--text", "t.txt", *LM_TINY],
    "seq2seq train": ["seq2seq", "train", "--steps", "1", *S2S_TINY],
    "train": ["train", "cnn", "--max-steps", "1", "--no-progress"],
}
OUT_KINDS = {
    "loop": "is a symlink loop",
    "loop/x": "is a path through a symlink loop",
    "dangling": "is a dangling symlink",
    "fifo": "is a FIFO",
}


@pytest.mark.parametrize("out", sorted(OUT_KINDS))
@pytest.mark.parametrize("command", sorted(OUT_COMMANDS))
def test_out_that_cannot_be_a_folder_is_named(command, out, odd, capsys):
    code = in_process([*OUT_COMMANDS[command], "--out", out])
    one_line(code, capsys.readouterr().err, 2, "--out", OUT_KINDS[out])


@pytest.mark.parametrize("name", ["run\nwrote elsewhere", "run\r", "a\tb", "x\x1b[31m"])
def test_control_characters_in_out_are_refused(name, odd, capsys):
    code = in_process([*OUT_COMMANDS["lm train"], "--out", name])
    one_line(code, capsys.readouterr().err, 2, "--out", "control characters")
    assert sorted(p.name for p in odd.iterdir()) == ["dangling", "dir", "fifo", "loop", "t.txt"]


def _truncated(path):
    buffer = io.BytesIO()
    torch.save({"format": "x", "weights": torch.zeros(1000)}, buffer)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])


READERS = {  # every command that reads an attnkit checkpoint, on a truncated one
    "lm train --resume": ["lm", "train", "--text", "t.txt", *LM_TINY, "--resume", "--out", "run"],
    "lm sample": ["lm", "sample", "--checkpoint", "run", "--prompt", "the"],
    "seq2seq train --resume": ["seq2seq", "train", "--steps", "1", *S2S_TINY, "--resume",
                               "--out", "run"],
    "train --resume": ["train", "cnn", "--max-steps", "1", "--no-progress", "--resume",
                       "--out", "run"],
    "eval": ["eval", "--checkpoint", "run"],
    "explain-image": ["explain-image", "--checkpoint", "run"],
}  # fmt: skip


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_truncated_checkpoint_is_named_as_not_readable(command, odd, capsys):
    _truncated(odd / "run" / "checkpoint.pt")
    code = in_process(READERS[command])
    line = one_line(code, capsys.readouterr().err, 2, "checkpoint.pt", "readable")
    assert "failed:" not in line


def test_a_pickled_weights_file_is_refused_without_torchs_warning(odd):
    # a child process: pytest's own warning capture would hide torch's UserWarning
    from tests.models.tiny import TINY

    folder = odd / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the"]))
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"a": [1, 2]}, protocol=4))
    code, _, err = attnkit(["explain", "the", "--checkpoint", folder, "--focus", "the"], cwd=odd)
    one_line(code, err, 1, "pytorch_model.bin", "not a readable PyTorch weights file")
    assert "UserWarning" not in err and "\x1b[" not in err


def test_a_plot_that_would_not_fit_in_memory_is_refused(odd, capsys):
    code = in_process(["flops", "--plot", "--dim", "100000", "--heads", "8", "--out", "p"])
    one_line(code, capsys.readouterr().err, 2, "--dim 100000", "GiB")
    assert not (odd / "p").exists()
