"""The command line's last holes (issue 28, item 4): each case refused with exit 2 and one
line naming the argument, or exit 1 and one line naming the file; before, each ran on,
failed with a traceback or an error that named neither. (What must still be accepted next
to these refusals is in tests/cli/test_cli_guards.py.)"""

from __future__ import annotations

import os
import shutil

import pytest

from attnkit.cli.main import build_parser
from tests.hostile.cli import attnkit, in_process, one_line

MAX_SEED = 2**63 - 1  # the documented bound of --seed
MAX_THREADS = 4 * (os.cpu_count() or 1)  # ... and of --threads
TEXT = "the cat sat on the mat. the dog sat on the log. " * 20
LM_TINY = ["--epochs", "1", "--steps-per-epoch", "1", "--batch-size", "2", "--context", "8",
           "--layers", "1", "--heads", "2", "--d-model", "8"]  # fmt: skip
S2S_TINY = ["--min-len", "3", "--max-len", "5", "--num-symbols", "5", "--batch-size", "8",
            "--eval-size", "4", "--eval-every", "2", "--no-progress"]  # fmt: skip


def _listing(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A scratch working folder holding a text file to train on."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_text(TEXT)
    return tmp_path


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    (root / "t.txt").write_text(TEXT)
    argv = ["lm", "train", "--text", root / "t.txt", "--out", root / "run", *LM_TINY]
    assert in_process(argv) == 0
    return root / "run"


# --- --out "": the current folder, where --force would overwrite what is there ---

OUT_COMMANDS = {
    "explain": ["explain", "the cat sat", "--focus", "cat"],
    "train": ["train", "cnn", "--max-steps", "1", "--no-progress"],
    "seq2seq": ["seq2seq", "train", "--steps", "1", *S2S_TINY],
    "lm": ["lm", "train", "--text", "t.txt", *LM_TINY],
    "flops": ["flops", "--dim", "32", "--heads", "2", "--plot", "--plot-max-tokens", "64"],
}


@pytest.mark.parametrize("name", sorted(OUT_COMMANDS))
def test_empty_out_is_refused(name, scratch, capsys):
    before = _listing(scratch)
    code = in_process([*OUT_COMMANDS[name], "--out", ""])
    one_line(code, capsys.readouterr().err, 2, "--out", "empty")
    assert _listing(scratch) == before  # nothing written into the current folder


# --- --seed 2**70: "Overflow when unpacking long long", not naming --seed ---

SEED = str(2**70)


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "cnn", "--max-steps", "1", "--no-progress"],
        ["seq2seq", "train", "--steps", "1", *S2S_TINY],
        ["lm", "train", "--text", "t.txt", *LM_TINY],
    ],
    ids=["train", "seq2seq-train", "lm-train"],
)
def test_seed_beyond_64_bits_is_refused(argv, scratch, capsys):
    code = in_process([*argv, "--seed", SEED, "--out", "run"])
    one_line(code, capsys.readouterr().err, 2, "--seed", "2**63 - 1")
    assert not (scratch / "run").exists()


def test_seed_beyond_64_bits_in_lm_sample(lm_run, capsys):
    """Exit 1 with torch's "Overflow when unpacking long long" before."""
    code = in_process(["lm", "sample", "--checkpoint", lm_run, "--prompt", "the", "--seed", SEED])
    one_line(code, capsys.readouterr().err, 2, "--seed")


@pytest.mark.parametrize(
    "argv",
    [["seq2seq", "eval", "run"], ["lm", "sample", "--checkpoint", "x", "--prompt", "a"]],
    ids=["seq2seq-eval", "lm-sample"],
)
@pytest.mark.parametrize("bad", [str(MAX_SEED + 1), "-1", SEED])
def test_every_seed_option_has_the_bound(argv, bad, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--seed", bad])
    assert "argument --seed: must be a whole number from 0" in capsys.readouterr().err


# --- --threads 512 under a memory limit: "SystemError: error return without exception set"
# (or, by the limit, OpenMP's "Thread creation failed" exit or a MemoryError) ---


def test_threads_beyond_the_machine_are_refused_under_a_memory_limit(tmp_path):
    argv = ["train", "cnn", "--threads", "512", "--max-steps", "1", "--no-progress"]
    code, _out, err = attnkit([*argv, "--out", str(tmp_path / "run")], limit=6 * 2**30)
    line = one_line(code, err, 2, "--threads", f"at most {MAX_THREADS}")
    assert "512" in line and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "argv",
    [["train", "cnn"], ["seq2seq", "train"], ["seq2seq", "decode", "x", "ab"], ["lm", "train"],
     ["bench"]],
)  # fmt: skip
def test_every_threads_option_has_the_bound(argv, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--threads", str(MAX_THREADS + 1)])
    assert "argument --threads:" in capsys.readouterr().err


# --- --layers 0-99999999999: a 49-line MemoryError traceback ---


@pytest.mark.parametrize("option", ["--layers", "--heads"])
def test_huge_index_range_is_checked_before_it_is_expanded(option, capsys, tmp_path):
    code = in_process(["explain", option, "0-99999999999", "--out", tmp_path / "o"])
    one_line(code, capsys.readouterr().err, 2, option, "99999999999", "out of range")
    assert not (tmp_path / "o").exists()


# --- a corrupt tokenizer.json: "expected ident at line 1 column 2", no file named ---


def test_corrupt_tokenizer_json_is_named(tmp_path, capsys):
    from attnkit.models import default_checkpoint

    folder = tmp_path / "ck"
    shutil.copytree(default_checkpoint(), folder)
    (folder / "tokenizer.json").write_text("{nonsense")
    code = in_process(["explain", "--checkpoint", folder, "--out", tmp_path / "o"])
    one_line(code, capsys.readouterr().err, 1, str(folder / "tokenizer.json"))
    assert not (tmp_path / "o").exists()


def test_corrupt_tokenizer_json_of_a_transformers_checkpoint_is_named(tmp_path, capsys):
    pytest.importorskip("transformers")
    from tests.integrations.checkpoints import save_text_checkpoint

    folder = save_text_checkpoint("gpt2", tmp_path / "gpt2")
    (folder / "tokenizer.json").write_text("{nonsense")
    capsys.readouterr()  # what saving it printed
    code = in_process(["explain", "--checkpoint", folder, "--out", tmp_path / "o"])
    one_line(code, capsys.readouterr().err, 1, str(folder / "tokenizer.json"), "not valid JSON")


# --- invalid UTF-8 in argv: a tokenizers TypeError ---


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ([b"explain", b"\xff\xfe", b"--out", b"o"], "TEXT"),
        ([b"explain", b"the cat", b"--focus", b"c\xffat", b"--out", b"o"], "--focus"),
        ([b"explain", b"the cat", b"--pair", b"\xfe", b"--out", b"o"], "--pair"),
        ([b"lm", b"sample", b"--checkpoint", b"o", b"--prompt", b"a\xff"], "--prompt"),
        ([b"seq2seq", b"decode", b"o", b"a\xffb"], "sequences"),
    ],
    ids=["text", "focus", "pair", "prompt", "sequences"],
)
def test_text_that_is_not_utf8_is_refused(argv, named, tmp_path):
    code, _out, err = attnkit(argv, cwd=tmp_path)
    one_line(code, err, 2, named, "UTF-8")
    assert not (tmp_path / "o").exists()
