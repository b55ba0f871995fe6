"""Every example command line runs and exits 0.

Where the examples come from:
- the "examples:" section of every command's --help epilog (`attnkit --help` included): the
  lines that start with "  attnkit " after a line "examples:", up to the first blank line;
- README.md: in ```bash, ```sh, ```shell and ```console blocks every line that starts with
  "attnkit ", and in any fenced block every line that starts with "$ attnkit ".

README convention for a command line the tests do not run: end it with the comment
"# not run: REASON"; it must then be in NOT_RUN below, with its reason (and nothing is in
NOT_RUN that is not so marked). An --help example is never skipped.

How they run: in-process (`main(argv)`), each group (the examples of one --help, or all of
the README) in order in a fresh folder, as a user would type them one after the other. The
eval and explain-image examples read the runs that the train examples made, so they start
from a copy of the train examples' folder (DEPENDS). Heavy commands get documented options
that make them tiny (CAPS), appended to the command line; nothing else is changed.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
from pathlib import Path

import pytest

from attnkit.cli.main import build_parser, main

README = Path(__file__).resolve().parents[2] / "README.md"
NOT_RUN: dict[str, str] = {}  # README command line -> why the tests do not run it
DEPENDS = {  # group -> group whose folder it reads
    "eval": "train",
    "explain-image": "train",
    "lm sample": "lm train",
    "seq2seq decode": "seq2seq train",
    "seq2seq eval": "seq2seq train",
}


def caps(argv: list[str]) -> list[str]:
    """Options appended to keep a heavy example tiny (each is a documented option)."""
    if argv[0] == "train":  # a few optimizer steps instead of minutes of training
        return ["--max-steps", "4" if "--resume" in argv else "2"]
    if argv[0] == "bench":  # the smoke run: small sizes, no memory subprocesses
        return ["--quick", "--no-memory", "--sizes", "16", "--repeats", "1"]
    if argv[0] == "flops" and "--plot" in argv:  # time one 8×8 grid, not up to 56×56
        return ["--plot-max-tokens", "64"]
    if argv[:2] == ["seq2seq", "train"]:  # a resumed example continues for 2 more steps
        steps = "4" if "--resume" in argv else "2"
        return ["--steps", steps, "--eval-size", "8", "--eval-every", "1"]
    if argv[:2] == ["seq2seq", "eval"]:
        return ["--eval-size", "8"]
    if argv[:2] == ["lm", "train"]:  # a fifth of the corpus, a few steps
        return ["--max-chars", "200000", "--max-steps", "4" if "--resume" in argv else "2"]
    if argv[:2] == ["lm", "sample"]:
        return ["--max-new-tokens", "20"]
    return []


def _parsers(parser, path=()) -> dict[str, object]:
    """{"train": parser, "seq2seq train": parser, ...} of every (sub)command; "" the top."""
    found = {" ".join(path): parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_parsers(sub, (*path, name)))
    return found


def epilog_examples(epilog: str | None) -> list[str]:
    lines = (epilog or "").splitlines()
    if "examples:" not in lines:
        return []
    found = []
    for line in lines[lines.index("examples:") + 1 :]:
        if not line.strip():
            break
        if line.startswith("  attnkit "):
            found.append(line.strip())
    return found


def readme_lines(text: str) -> list[str]:
    """Command lines of README.md, as written (comments included)."""
    found = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S):
        for line in body.splitlines():
            line = line.strip()
            if line.startswith("$ attnkit "):
                found.append(line[2:])
            elif lang in ("bash", "sh", "shell", "console") and line.startswith("attnkit "):
                found.append(line)
    return found


def groups() -> dict[str, list[str]]:
    out = {}
    for name, parser in _parsers(build_parser()).items():
        examples = epilog_examples(parser.epilog)
        if examples:
            out[f"help {name}".strip()] = examples
    out["README.md"] = [
        line for line in readme_lines(README.read_text()) if "# not run:" not in line
    ]
    return out


GROUPS = groups()
_done: dict[str, Path] = {}


def run_group(name: str, root: Path, monkeypatch) -> Path:
    """Run the examples of group `name` in a fresh folder under `root`; that folder."""
    if name in _done:
        return _done[name]
    folder = root / name.replace(" ", "-")
    depends = DEPENDS.get(name.removeprefix("help "))
    if depends:
        shutil.copytree(run_group(f"help {depends}", root, monkeypatch), folder)
    folder.mkdir(exist_ok=True)
    monkeypatch.chdir(folder)
    for line in GROUPS[name]:
        argv = shlex.split(line, comments=True)[1:]  # drop the leading "attnkit"
        try:
            code = main([*argv, *caps(argv)])
        except SystemExit as e:  # argparse: usage errors and --help
            code = e.code
        assert code == 0, f"{name}: `{line}` exited {code}"
    _done[name] = folder
    return folder


def test_commands_i_document_have_examples():
    for name in ("", "train", "eval", "explain-image", "flops"):
        assert f"help {name}".strip() in GROUPS, f"`attnkit {name} --help` has no examples:"


def test_readme_has_command_lines_and_marks_match_not_run():
    lines = readme_lines(README.read_text())
    marked = {line.split("#")[0].strip() for line in lines if "# not run:" in line}
    assert marked == set(NOT_RUN)
    assert len(lines) - len(marked) >= 4


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("examples")


@pytest.mark.parametrize("name", sorted(GROUPS, key=lambda n: (n != "help train", n)))
def test_examples_run(name, root, monkeypatch, capsys):
    run_group(name, root, monkeypatch)
    capsys.readouterr()  # the commands' output is not the point here
