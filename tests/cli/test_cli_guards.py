"""What stays accepted next to the refusals of tests/hostile/test_cli_holes.py: the bounds
themselves, `--out .`, ranges of --layers / --heads, paths that are not UTF-8 (file names
are bytes on POSIX)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from attnkit.cli._common import MAX_SEED, max_threads
from attnkit.cli.main import build_parser, main


def test_the_bounds_themselves_are_accepted():
    parser = build_parser()
    for argv in (
        ["seq2seq", "eval", "run"],
        ["lm", "sample", "--checkpoint", "x", "--prompt", "a"],
    ):
        for seed in (0, MAX_SEED):
            assert parser.parse_args([*argv, "--seed", str(seed)]).seed == seed
    args = parser.parse_args(["train", "cnn", "--threads", str(max_threads())])
    assert args.threads == max_threads() == 4 * (os.cpu_count() or 1)


def test_out_dot_means_the_current_folder_on_purpose():
    assert str(build_parser().parse_args(["explain", "--out", "."]).out) == "."


def test_ranges_select_what_they_say(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["explain", "--layers", "1-2", "-1", "--heads", "0,3-4", "--out", str(out), "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["layers"] == [1, 2, 5] and summary["heads"] == [0, 3, 4]


def test_a_path_that_is_not_utf8_is_a_folder_like_any_other(tmp_path):
    out = os.fsencode(tmp_path) + b"/r\xffun"
    src = os.fsencode(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
    env = {**os.environb, b"PYTHONPATH": src, b"HF_HUB_OFFLINE": b"1"}
    argv = [b"explain", b"the cat", b"--focus", b"cat", b"--quiet", b"--out", out]
    done = subprocess.run([sys.executable, "-m", "attnkit", *argv], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert os.path.isfile(out + b"/attention.json")
