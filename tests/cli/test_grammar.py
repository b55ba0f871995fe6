"""The one command-line grammar, table-driven over train, eval, explain-image and flops:
an existing result in --out is refused without --force (before any work, nothing changed),
--json prints exactly one JSON object on stdout, --quiet prints only the summary line, and
the last stdout line says what was done and where it was written."""

from __future__ import annotations

import argparse
import json

import pytest

from attnkit.cli import flops_plot
from attnkit.cli.main import main

# name: (argv without --out, the files the command writes into --out)
COMMANDS = {
    "train": (["train", "cnn", "--epochs", "1", "--max-steps", "2"], ("checkpoint.pt",)),
    "eval": (["eval", "--checkpoint", "{run}"], ("eval.json",)),
    "explain-image": (
        ["explain-image", "--checkpoint", "{run}", "--images", "2"],
        ("attention.png", "head_distance.png"),
    ),
    "flops-plot": (
        ["flops", "--dim", "16", "--heads", "2", "--plot", "--plot-max-tokens", "64"],
        ("cost.png",),
    ),
    "flops": (["flops", "--tokens", "9", "--dim", "12", "--heads", "4"], ()),
}
WRITERS = [name for name, (_, files) in COMMANDS.items() if files]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny ViT run that eval and explain-image read."""
    out = tmp_path_factory.mktemp("run")
    argv = ["train", "vit", "--epochs", "1", "--max-steps", "2", "--quiet", "--force"]
    assert main([*argv, "--out", str(out)]) == 0
    return out


@pytest.fixture(autouse=True)
def _fast_plot(monkeypatch):
    monkeypatch.setattr(flops_plot, "sgemm_gflops", lambda size=2048: 1.0)


def call(name, run_dir, out, *extra, capsys):
    argv = [a.format(run=run_dir) for a in COMMANDS[name][0]]
    try:
        code = main([*argv, "--out", str(out), *extra])
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def snapshot(root) -> dict:
    return {p.relative_to(root): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("name", WRITERS)
def test_existing_result_is_refused_without_force(name, run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    files = COMMANDS[name][1]
    for file in files:
        (out / file).write_bytes(b"an earlier result")
    before = snapshot(tmp_path)
    code, stdout, err = call(name, run_dir, out, capsys=capsys)
    assert code == 2 and stdout == ""
    (line,) = err.strip().splitlines()
    assert f"attnkit {COMMANDS[name][0][0]}: error: --out" in line
    assert "already holds" in line and files[0] in line and "--force" in line
    assert snapshot(tmp_path) == before
    code, stdout, err = call(name, run_dir, out, "--force", "--quiet", capsys=capsys)
    assert code == 0, err
    assert all((out / f).read_bytes() != b"an earlier result" for f in files)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_json_prints_one_json_object_and_nothing_else(name, run_dir, tmp_path, capsys):
    code, stdout, err = call(name, run_dir, tmp_path / "out", "--json", capsys=capsys)
    assert code == 0, err
    data = json.loads(stdout)  # the whole of stdout is one JSON document
    assert stdout.count("\n") == 1 and stdout.startswith("{")
    assert data["command"] == COMMANDS[name][0][0]
    for file in COMMANDS[name][1]:
        assert str(tmp_path / "out" / file) in data["files"]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_quiet_prints_only_the_summary_line(name, run_dir, tmp_path, capsys):
    code, stdout, err = call(name, run_dir, tmp_path / "out", "--quiet", capsys=capsys)
    assert code == 0, err
    assert stdout.count("\n") == 1 and stdout.startswith(f"attnkit {COMMANDS[name][0][0]}: ")
    assert err == ""  # no progress bar, no per-epoch lines


@pytest.mark.parametrize("name", list(COMMANDS))
def test_last_line_says_what_was_done_and_where(name, run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = call(name, run_dir, out, capsys=capsys)
    assert code == 0, err
    last = stdout.strip().splitlines()[-1]
    assert last.startswith(f"attnkit {COMMANDS[name][0][0]}: ")
    files = COMMANDS[name][1]
    if files:
        assert f"to {out}/" in last and all(f in last for f in files)
        assert all((out / f).stat().st_size > 0 for f in files)
    else:
        assert "nothing written" in last and not out.exists()


@pytest.mark.parametrize("command", ["train", "eval", "explain-image", "flops", ""])
def test_every_option_has_help_for_users(command):
    from attnkit.cli.main import build_parser

    parser = build_parser()
    if command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[command]
    assert "examples:\n  attnkit " in (parser.epilog or "")
    assert parser.description and "`attnkit.cli" not in parser.description
    for action in parser._actions:
        assert action.help and len(action.help) >= 10, action.option_strings or action.dest
