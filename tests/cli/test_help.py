"""Every --help keeps its examples on their own lines, and every usage error points to the
help of the (sub)command that was typed: `attnkit lm train --epoch 3` names
`attnkit lm train --help`, not `attnkit --help`."""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

from attnkit.cli.main import build_parser, main
from tests.cli.test_examples import _parsers

PARSERS = _parsers(build_parser())
LEAVES = [
    name
    for name, p in PARSERS.items()
    if name and not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
]
EXAMPLE = re.compile(r"^ {2,}(attnkit|torchrun|python) ")


def _demo_help() -> str:
    from attnkit.distributed import train_demo

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        train_demo.parse(["--help"])
    return out.getvalue()


def _helps(monkeypatch) -> dict[str, tuple[str, str]]:
    """prog -> (its --help at 80 columns, the text its examples come from)."""
    monkeypatch.setenv("COLUMNS", "80")  # narrow: where a paragraph formatter would rewrap
    helps = {
        f"attnkit {n}".strip(): (p.format_help(), f"{p.description or ''}\n{p.epilog or ''}")
        for n, p in PARSERS.items()
    }
    from attnkit.distributed import train_demo

    helps["python -m attnkit.distributed.train_demo"] = (_demo_help(), train_demo.__doc__)
    return helps


def test_every_help_shows_its_examples_each_on_its_own_line(monkeypatch):
    for prog, (text, source) in _helps(monkeypatch).items():
        lines = [line.rstrip() for line in text.splitlines()]
        examples = [line.rstrip() for line in source.splitlines() if EXAMPLE.match(line)]
        assert examples, f"{prog} --help shows no example command line"
        for line in examples:  # as written: not run into the paragraph around it
            assert line in lines, (prog, line)
        # a backslash only ends a line (a shell continuation), never lands inside a paragraph
        for line in lines:
            assert "\\" not in line[:-1], (prog, line)


def test_every_subcommand_ends_its_help_with_examples():
    for name in LEAVES:
        p = PARSERS[name]
        assert issubclass(p.formatter_class, argparse.RawDescriptionHelpFormatter), name
        shown = f"{p.description or ''}\n{p.epilog or ''}"
        assert f"  attnkit {name}" in shown, f"attnkit {name} --help: no examples"


def test_the_demo_example_keeps_its_continuation_line():
    text = _demo_help()
    assert "train_demo --out runs/cp \\\n        --seq-len 16384" in text


@pytest.mark.parametrize("name", LEAVES)
def test_a_mistyped_option_points_to_the_subcommands_own_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([*name.split(), "--no-such-option"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"attnkit {name}: error: ")
    assert err.endswith(f"(see attnkit {name} --help)")


@pytest.mark.parametrize("argv", [["--nonsense"], ["--nonsense", "lm", "train"]])
def test_a_mistyped_top_level_option_points_to_the_top_level_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith("(see attnkit --help)")
