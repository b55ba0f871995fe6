"""Hostile input, every command: exit code, one line on stderr naming the argument, no
traceback, and nothing written anywhere (the --out folder included).

Runs `main(argv)` in-process inside a scratch folder, so the default `attnkit-out/` lands
there too. `{file}`, `{dir}`, `{garbage}`, ... in an argv are replaced by prepared paths.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from attnkit.cli.main import main

LONG = "x" * 300  # longer than NAME_MAX (255) on every common file system

# (id, argv, exit code, words the one line must contain)
CASES = [
    ("unknown-command", ["nope"], 2, ["invalid choice", "nope"]),
    ("explain-empty-text", ["explain", "  "], 2, ["TEXT is empty"]),
    ("explain-empty-pair", ["explain", "a b", "--pair", " "], 2, ["--pair"]),
    ("explain-top-zero", ["explain", "--top", "0"], 2, ["--top", "at least 1"]),
    ("explain-top-word", ["explain", "--top", "many"], 2, ["--top"]),
    ("explain-layers-backwards", ["explain", "--layers", "5-3"], 2, ["--layers"]),
    ("explain-layers-word", ["explain", "--layers", "all"], 2, ["--layers"]),
    ("explain-layers-too-big", ["explain", "--layers", "3-9"], 2, ["--layers", "out of range"]),
    ("explain-heads-too-big", ["explain", "--heads", "0,12"], 2, ["--heads", "out of range"]),
    ("explain-focus-absent", ["explain", "a cat", "--focus", "dog"], 2, ["--focus", "dog"]),
    ("explain-focus-unk", ["explain", "I like ☃ and ☂", "--focus", "☂"], 2, ["--focus", "[UNK]"]),
    ("explain-focus-empty", ["explain", "a cat", "--focus", ""], 2, ["--focus"]),
    ("explain-checkpoint-file", ["explain", "--checkpoint", "{file}"], 2, ["--checkpoint", "file"]),
    ("explain-checkpoint-missing", ["explain", "--checkpoint", "{missing}"], 2, ["--checkpoint"]),
    ("explain-out-file", ["explain", "--out", "{file}"], 2, ["--out", "is a file"]),
    ("explain-out-under-file", ["explain", "--out", "{file}/sub"], 2, ["--out", "is a file"]),
    ("explain-out-too-long", ["explain", "--out", LONG], 2, ["--out", "too long"]),
    ("explain-out-unwritable", ["explain", "--out", "/sys/attnkit-x"], 2, ["--out", "permission"]),
    ("explain-out-taken", ["explain", "--out", "{taken}"], 2, ["--out", "--force"]),
    ("flops-heads-zero", ["flops", "--tokens", "4", "--dim", "8", "--heads", "0"], 2, ["--heads"]),
    (
        "flops-kv-heads-zero",
        ["flops", "--tokens", "4", "--dim", "8", "--heads", "2", "--kv-heads", "0"],
        2,
        ["--kv-heads"],
    ),
    ("flops-ff-negative", ["flops", "--model", "bert", "--ff", "-5"], 2, ["--ff"]),
    ("flops-vit-tokens", ["flops", "--model", "vit", "--tokens", "100"], 2, ["--tokens"]),
    ("flops-no-dim", ["flops", "--tokens", "4"], 2, ["--dim"]),
    ("flops-bad-grid", ["flops", "--dim", "8", "--heads", "2", "--grid", "ax3"], 2, ["--grid"]),
    ("flops-dim-word", ["flops", "--dim", "wide"], 2, ["--dim"]),
    ("train-unknown-model", ["train", "gpt"], 2, ["invalid choice"]),
    ("train-epochs-zero", ["train", "cnn", "--epochs", "0"], 2, ["--epochs"]),
    ("train-lr-inf", ["train", "cnn", "--lr", "inf"], 2, ["--lr"]),
    ("train-lr-nan", ["train", "cnn", "--lr", "nan"], 2, ["--lr"]),
    ("train-resume-and-force", ["train", "cnn", "--resume", "--force"], 2, ["--resume", "--force"]),
    ("train-batch-zero", ["train", "cnn", "--batch-size", "0"], 2, ["--batch-size"]),
    ("train-threads-zero", ["train", "cnn", "--threads", "0"], 2, ["--threads"]),
    ("train-out-file", ["train", "cnn", "--out", "{file}"], 2, ["--out", "is a file"]),
    ("train-out-too-long", ["train", "cnn", "--out", LONG], 2, ["--out", "too long"]),
    ("flops-plot-path", ["flops", "--plot", "sub/cost.png"], 2, ["--plot", "inside --out"]),
    ("flops-plot-not-png", ["flops", "--plot", "cost.pdf"], 2, ["--plot", ".png"]),
    ("flops-plot-max-small", ["flops", "--plot", "--plot-max-tokens", "9"], 2, ["--plot-max"]),
    ("flops-plot-tokens", ["flops", "--plot", "--tokens", "9"], 2, ["--plot", "--tokens"]),
    ("flops-plot-model", ["flops", "--plot", "--model", "vit"], 2, ["--plot", "--model"]),
    ("flops-plot-out-file", ["flops", "--plot", "--out", "{file}"], 2, ["--out", "is a file"]),
    ("explain-image-images-zero", ["explain-image", "--images", "0"], 2, ["--images"]),
    ("explain-image-discard-1", ["explain-image", "--discard-ratio", "1"], 2, ["--discard"]),
    ("eval-garbage", ["eval", "--checkpoint", "{garbage}"], 2, ["--checkpoint", "not"]),
    ("eval-empty", ["eval", "--checkpoint", "{empty}"], 2, ["--checkpoint", "not"]),
    ("eval-foreign", ["eval", "--checkpoint", "{foreign}"], 2, ["--checkpoint", "marker"]),
    ("eval-missing", ["eval", "--checkpoint", "{missing}"], 2, ["--checkpoint"]),
    ("eval-file", ["eval", "--checkpoint", "{file}"], 2, ["--checkpoint", "file"]),
    ("explain-image-garbage", ["explain-image", "--checkpoint", "{garbage}"], 2, ["--checkpoint"]),
    ("explain-image-foreign", ["explain-image", "--checkpoint", "{foreign}"], 2, ["marker"]),
    ("resume-garbage", ["train", "cnn", "--resume", "--out", "{garbage}"], 2, ["not"]),
    ("decode-garbage", ["seq2seq", "decode", "{garbage}", "abc"], 2, ["not"]),
    ("decode-foreign", ["seq2seq", "decode", "{foreign}", "abc"], 2, ["marker"]),
    ("decode-missing", ["seq2seq", "decode", "{missing}", "abc"], 2, ["checkpoint"]),
    ("seq2seq-huge-len", ["seq2seq", "train", "--max-len", "100000"], 2, ["--max-len"]),
    ("seq2seq-zero-len", ["seq2seq", "train", "--max-len", "0"], 2, ["--max-len"]),
    ("seq2seq-out-file", ["seq2seq", "train", "--out", "{file}"], 2, ["--out"]),
    ("seq2seq-bad-task", ["seq2seq", "train", "--task", "fly"], 2, ["--task"]),
    ("lm-text-missing", ["lm", "train", "--text", "{missing}"], 2, ["--text", "no such file"]),
    ("lm-text-empty", ["lm", "train", "--text", "{empty}/checkpoint.pt"], 2, ["--text", "empty"]),
    ("lm-text-binary", ["lm", "train", "--text", "{garbage}/checkpoint.pt"], 2, ["not UTF-8"]),
    ("lm-text-short", ["lm", "train", "--text", "{file}"], 2, ["--text", "too few"]),
    ("lm-epochs-zero", ["lm", "train", "--epochs", "0"], 2, ["--epochs"]),
    ("lm-lr-nan", ["lm", "train", "--lr", "nan"], 2, ["--lr"]),
    ("lm-context-word", ["lm", "train", "--context", "long"], 2, ["--context"]),
    ("lm-heads-width", ["lm", "train", "--d-model", "10", "--heads", "4"], 2, ["--d-model"]),
    (
        "lm-sample-garbage",
        ["lm", "sample", "--checkpoint", "{garbage}", "--prompt", "a"],
        2,
        ["--checkpoint", "not readable"],
    ),
    (
        "lm-sample-empty",
        ["lm", "sample", "--checkpoint", "{empty}", "--prompt", "a"],
        2,
        ["--checkpoint"],
    ),
    (
        "lm-sample-foreign",
        ["lm", "sample", "--checkpoint", "{foreign}", "--prompt", "a"],
        2,
        ["--checkpoint", "attnkit lm"],
    ),
    (
        "lm-sample-missing",
        ["lm", "sample", "--checkpoint", "{missing}", "--prompt", "a"],
        2,
        ["--checkpoint"],
    ),
    (
        "lm-sample-file",
        ["lm", "sample", "--checkpoint", "{file}", "--prompt", "a"],
        2,
        ["--checkpoint", "file"],
    ),
    (
        "lm-sample-top-p",
        ["lm", "sample", "--checkpoint", "x", "--prompt", "a", "--top-p", "2"],
        2,
        ["--top-p"],
    ),
    (
        "lm-sample-temperature",
        ["lm", "sample", "--checkpoint", "x", "--prompt", "a", "--temperature", "inf"],
        2,
        ["--temperature"],
    ),
    ("seq2seq-bad-model", ["seq2seq", "train", "--model", "lstm"], 2, ["--model"]),
    ("seq2seq-bad-cell", ["seq2seq", "train", "--model", "rnn", "--cell", "rnn"], 2, ["--cell"]),
    (
        "seq2seq-bad-attention",
        ["seq2seq", "train", "--model", "rnn", "--attention", "luong"],
        2,
        ["--attention"],
    ),
    ("seq2seq-cell-not-rnn", ["seq2seq", "train", "--cell", "gru"], 2, ["--cell", "rnn"]),
    (
        "seq2seq-act-not-universal",
        ["seq2seq", "train", "--model", "rnn", "--act"],
        2,
        ["--act", "universal"],
    ),
    (
        "seq2seq-attention-not-rnn",
        ["seq2seq", "train", "--model", "universal", "--attention", "dot"],
        2,
        ["--attention", "rnn"],
    ),
    ("seq2seq-ut-steps-zero", ["seq2seq", "train", "--ut-steps", "0"], 2, ["--ut-steps"]),
    (
        "seq2seq-ut-steps-huge",
        ["seq2seq", "train", "--model", "universal", "--ut-steps", "100000"],
        2,
        ["--ut-steps"],
    ),
    ("seq2seq-ut-steps-word", ["seq2seq", "train", "--ut-steps", "many"], 2, ["--ut-steps"]),
    ("seq2seq-lr-nan", ["seq2seq", "train", "--lr", "nan"], 2, ["--lr"]),
    ("seq2seq-batch-zero", ["seq2seq", "train", "--batch-size", "0"], 2, ["--batch-size"]),
    (
        "seq2seq-preset-rnn",
        ["seq2seq", "train", "--model", "rnn", "--preset", "big"],
        2,
        ["--preset"],
    ),
    ("seq2seq-bad-preset", ["seq2seq", "train", "--preset", "huge"], 2, ["preset"]),
    ("seq2seq-out-too-long", ["seq2seq", "train", "--out", LONG], 2, ["--out", "too long"]),
    ("seq2seq-out-taken", ["seq2seq", "train", "--out", "{taken_s2s}"], 2, ["--out", "--force"]),
    (
        "seq2seq-resume-force",
        ["seq2seq", "train", "--out", "{taken_s2s}", "--resume", "--force"],
        2,
        ["--resume", "--force"],
    ),
    (
        "seq2seq-resume-missing",
        ["seq2seq", "train", "--resume", "--out", "{missing}"],
        2,
        ["--resume"],
    ),
    ("seq2seq-eval-garbage", ["seq2seq", "eval", "{garbage}"], 2, ["not"]),
    ("seq2seq-eval-file", ["seq2seq", "eval", "{file}"], 2, ["model.pt", "not"]),
    (
        "seq2seq-eval-size-zero",
        ["seq2seq", "eval", "{garbage}", "--eval-size", "0"],
        2,
        ["--eval-size"],
    ),
    (
        "seq2seq-decode-beam-zero",
        ["seq2seq", "decode", "{garbage}", "ab", "--beam", "0"],
        2,
        ["--beam"],
    ),
    ("bench-threads-zero", ["bench", "--threads", "0"], 2, ["--threads"]),
    ("bench-sizes-zero", ["bench", "--sizes", "0"], 2, ["--sizes"]),
    ("bench-out-file", ["bench", "--quick", "--out", "{file}"], 2, ["--out", "is a file"]),
    ("bench-out-taken", ["bench", "--quick", "--out", "{taken_bench}"], 2, ["--force"]),
]


@pytest.fixture
def place(tmp_path, monkeypatch):
    """Prepared paths inside a scratch working directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.pt").write_bytes(b"not a folder")
    for name, content in {"garbage": b"\x80\x04garbage", "empty": b""}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "checkpoint.pt").write_bytes(content)
    (tmp_path / "foreign").mkdir()
    torch.save({"model": {}, "run_info": {}}, tmp_path / "foreign" / "checkpoint.pt")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "attention.json").write_text("{}")
    (tmp_path / "taken_s2s").mkdir()
    (tmp_path / "taken_s2s" / "checkpoint.pt").write_bytes(b"an earlier run")
    (tmp_path / "taken_bench").mkdir()
    (tmp_path / "taken_bench" / "bench.json").write_text("{}")
    names = ("garbage", "empty", "foreign", "taken", "taken_bench", "taken_s2s")
    return {"file": "model.pt", "missing": "nowhere", **{n: n for n in names}}


def snapshot(root) -> dict:
    """{relative path: (size, mtime_ns)} of every file and folder under `root`."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.stat(path)
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize(
    ("argv", "code", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_hostile_input(argv, code, words, place, tmp_path, capsys):
    argv = [a.format(**place) if "{" in a else a for a in argv]
    before = snapshot(tmp_path)
    try:
        got = main(argv)
    except SystemExit as e:  # argparse's own errors
        got = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert got == code, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert ": error: " in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert snapshot(tmp_path) == before  # nothing written, nothing created, nothing changed


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: attnkit" in capsys.readouterr().err


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_training_that_diverges_stops_with_exit_1_and_valid_json(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "cnn", "--epochs", "2", "--max-steps", "4", "--no-progress"]
    code = main([*argv, "--lr", "1e30", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "loss is" in lines[0] and "--lr" in lines[0], err
    for path in out.glob("*.json"):
        _strict_json(path.read_text())  # no bare NaN


def test_resume_with_no_epochs_left_is_refused_and_keeps_config(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "cnn", "--epochs", "1", "--max-steps", "2", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    config = (out / "config.json").read_bytes()
    capsys.readouterr()
    before = snapshot(tmp_path)
    assert main([*argv, "--resume"]) == 2
    line = capsys.readouterr().err.strip()
    assert "already done 1 epochs" in line and "\n" not in line
    assert (out / "config.json").read_bytes() == config
    assert snapshot(tmp_path) == before
