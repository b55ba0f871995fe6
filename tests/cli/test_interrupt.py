"""Ctrl-C (SIGINT) during a long command: exit 130, one line, no traceback, and the --out
folder holds only complete files (results are written atomically after all is computed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest


def _popen(args: list[str], **kw) -> subprocess.Popen:
    """The command with Ctrl-C's default action restored in the child: a test suite launched
    in the background (`nohup … &`) runs with SIGINT ignored, which the child would inherit,
    and Python then never installs its KeyboardInterrupt handler (found by a fresh-clone run
    started that way: the interrupted commands ran on to exit 0)."""
    restore = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if os.name == "posix" else None
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=restore, **kw
    )


CASES = {
    "bench": (["bench", "--quick", "--no-memory", "--sizes", "16", "--repeats", "1"], ("bench",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ctrl_c_exits_130_with_one_line_and_no_partial_files(name, tmp_path):
    argv, started = CASES[name]
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = _popen(
        [sys.executable, "-m", "attnkit", *argv, "--out", str(out)],
        env=env,
    )
    seen = ""
    while not any(m in seen for m in started):  # past parsing and checks, into the work
        line = proc.stderr.readline()
        assert line, f"{name} ended before starting its work: {seen}"
        seen += line
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _stdout, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + rest
    assert "Traceback" not in rest
    assert (
        rest.strip().splitlines()[-1]
        == f"attnkit {name}: interrupted; only complete files were written"
    )
    leftovers = [p.name for p in out.iterdir()] if out.exists() else []
    assert not [n for n in leftovers if n.startswith(".") or n.endswith(".tmp")], leftovers


# `explain` finishes in a few seconds and announces no step then, so the test stalls it at a
# known point instead of guessing one: after the first of its files is written (the others are
# rendered and waiting), `atomic_write_bytes` says so and sleeps, and Ctrl-C lands there.
STALL_EXPLAIN = """
import sys, time
import attnkit._io as io
real = io.atomic_write_bytes
def stalled(path, data):
    done = real(path, data)
    print("STALLED after " + done.name, file=sys.stderr, flush=True)
    time.sleep(120)
    return done
io.atomic_write_bytes = stalled
sys.argv = ["attnkit", "explain", "--out", sys.argv[1]]
from attnkit.cli.main import console
console()
"""


def test_ctrl_c_while_explain_writes_keeps_only_complete_files(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = _popen(
        [sys.executable, "-c", STALL_EXPLAIN, str(out)],
        env=env,
    )
    seen = ""
    while "STALLED after" not in seen:
        line = proc.stderr.readline()
        assert line, f"explain ended before writing: {seen}"
        seen += line
    proc.send_signal(signal.SIGINT)
    _stdout, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + rest
    assert "Traceback" not in rest
    assert (
        rest.strip().splitlines()[-1]
        == "attnkit explain: interrupted; only complete files were written"
    )
    first = seen.split("STALLED after ")[1].split()[0]
    assert [p.name for p in out.iterdir()] == [first]  # complete, and nothing half-written


def test_ctrl_c_during_training_keeps_the_last_finished_epoch(tmp_path):
    out = tmp_path / "run"
    proc = _popen(
        [sys.executable, "-m", "attnkit", "train", "cnn", "--epochs", "30", "--out", str(out)],
    )
    seen = ""
    while "epoch 1  " not in seen:  # the first epoch's line: its checkpoint is written
        line = proc.stderr.readline()
        assert line, f"train ended before its first epoch: {seen}"
        seen += line
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + rest
    assert "Traceback" not in rest and stdout == ""
    last = rest.strip().splitlines()[-1]
    assert last.startswith("attnkit train: interrupted; only complete files were written")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "config.json", "metrics.json"]
    from attnkit.train.loop import read_checkpoint

    epochs = read_checkpoint(out / "checkpoint.pt")["epoch"]
    assert epochs >= 1 and json.loads((out / "metrics.json").read_text())["epoch"] == epochs


def test_ctrl_c_during_lm_train_names_the_checkpoint_it_kept(tmp_path):
    """SIGINT while `lm train` runs: exit 130, and the last line names the checkpoint kept,
    its step and epoch, which is what the file holds; --resume continues from it."""
    import re

    import torch

    from attnkit.cli.main import main

    (tmp_path / "t.txt").write_text("the cat sat on the mat. the dog sat on the log. " * 20)
    out = tmp_path / "lm"
    argv = ["lm", "train", "--text", str(tmp_path / "t.txt"), "--out", str(out),
            "--steps-per-epoch", "2", "--batch-size", "4", "--context", "16", "--layers", "1",
            "--heads", "2", "--d-model", "16", "--threads", "1"]  # fmt: skip
    proc = _popen([sys.executable, "-m", "attnkit", *argv, "--epochs", "1000"])
    seen = ""
    while "[lm] epoch 2/" not in seen:  # the first checkpoint is written, the second soon
        line = proc.stderr.readline()
        assert line, f"lm train ended before its second epoch: {seen}"
        seen += line
    proc.send_signal(signal.SIGINT)
    stdout, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + rest
    assert "Traceback" not in rest and stdout == ""
    last = rest.strip().splitlines()[-1]
    pattern = r"attnkit lm train: interrupted; kept (.+) \(step (\d+), epoch (\d+)\); "
    found = re.fullmatch(pattern + "--resume continues from it", last)
    assert found, last
    path, step, epoch = found[1], int(found[2]), int(found[3])
    assert path == str(out / "checkpoint.pt") and epoch >= 1 and step == 2 * epoch
    state = torch.load(path, weights_only=True)
    assert (state["step"], state["epoch"]) == (step, epoch)
    history = json.loads((out / "history.json").read_text())["history"]
    assert history[-1]["steps"] >= step  # written just before the checkpoint: never behind
    assert main([*argv, "--epochs", str(epoch + 1), "--resume", "--quiet"]) == 0
    assert torch.load(path, weights_only=True)["step"] == step + 2
