"""The command line on a console that is not UTF-8, and Ctrl-C after the command is over
(issue 39).

`PYTHONIOENCODING=ascii attnkit --help` printed a UnicodeEncodeError traceback (×), and
`PYTHONIOENCODING=cp1252 attnkit flops ...` exited 1 on ᵀ: on a Windows console `flops`
could not print its result. One child process per encoding prints every (sub)command's
--help and makes real runs (flops, a tiny lm train) in that encoding.

Ctrl-C while a short run was finishing once printed a KeyboardInterrupt traceback and
exited 0: the interrupt came after `main` had returned, during the interpreter's teardown.
"""

from __future__ import annotations

import pytest

from tests.hostile.cli import popen

CHILD = r"""
import argparse, sys
from attnkit.cli.main import build_parser, main

def parsers(parser, path=()):
    found = [list(path)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += parsers(sub, (*path, name))
    return found

for path in parsers(build_parser()):
    try:
        main([*path, "--help"])
    except SystemExit as e:
        assert e.code in (0, None), (path, e.code)
text, out = sys.argv[1], sys.argv[2]
runs = [
    ["flops", "--tokens", "8", "--dim", "16", "--heads", "2"],
    ["flops", "--tokens", "8", "--dim", "16", "--heads", "2", "--json"],
    ["lm", "train", "--text", text, "--out", out, "--epochs", "1", "--steps-per-epoch", "1",
     "--batch-size", "2", "--context", "8", "--layers", "1", "--heads", "2", "--d-model", "8"],
]
for argv in runs:
    assert main(argv) == 0, argv
"""


@pytest.mark.parametrize("encoding", ["ascii", "cp1252"])
def test_every_help_and_real_runs_print_on_a_console_that_is_not_utf8(encoding, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat. " * 60)
    proc = popen([text, tmp_path / "run"], script=CHILD, env={"PYTHONIOENCODING": encoding})
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    shown = out.decode(encoding)  # what the console shows: every byte in its encoding
    assert "Traceback" not in err.decode(errors="replace")
    assert "attnkit flops: self-attention layer" in shown
    assert "QK^T" in shown or "QKᵀ" in shown  # ᵀ has no cp1252 or ascii byte: "^T" stands in
    assert "attnkit lm train:" in shown


TEARDOWN = r"""
import atexit, os, signal, time
import attnkit.cli.main as cli

def finished(argv=None):
    print("attnkit fake: done; wrote nothing")
    # Ctrl-C during the interpreter's teardown, after the command is over
    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(2)))
    return 0

cli.main = finished
cli.console()
"""

RAISES = r"""
import attnkit.cli.main as cli

def interrupted(argv=None):
    raise KeyboardInterrupt  # as if Ctrl-C came while main let go of --out, after its handler

cli.main = interrupted
cli.console()
"""


@pytest.mark.parametrize("script", [TEARDOWN, RAISES], ids=["teardown", "after-main"])
def test_ctrl_c_after_the_command_exits_130_with_one_line(script):
    proc = popen([], script=script)
    _, err = proc.communicate(timeout=60)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 130, (proc.returncode, err.decode())
    assert "Traceback" not in err.decode() and len(lines) == 1, err.decode()
    assert "interrupted; only complete files were written" in lines[0]
