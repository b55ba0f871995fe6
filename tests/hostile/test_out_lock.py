"""One run at a time in an --out folder (issue 28, item 4): two runs started at once on one
folder both exited 0 and left a mixed folder (the config of one, the checkpoint and
metrics of the other). The second is now refused at once, naming the first's pid."""

from __future__ import annotations

import time

from tests.hostile.cli import in_process, one_line, popen

S2S = ["seq2seq", "train", "--min-len", "3", "--max-len", "5", "--num-symbols", "5",
       "--batch-size", "8", "--eval-size", "4", "--no-progress"]  # fmt: skip
EXPLAIN = ["explain", "the cat sat", "--focus", "cat", "--quiet", "--force"]
# Holds a folder as a command does (prepare_out), then waits to be killed.
HOLD = """
import sys, time
from pathlib import Path
from attnkit.cli._common import prepare_out
prepare_out(Path(sys.argv[1]), ())
print("HOLDING", flush=True)
time.sleep(300)
"""


def _wait_until(ready, proc, what: str) -> None:
    deadline = time.monotonic() + 120
    while not ready():
        assert proc.poll() is None, proc.communicate()[1].decode()
        assert time.monotonic() < deadline, f"{what} never started"
        time.sleep(0.05)


def test_a_second_run_on_a_busy_folder_is_refused_naming_the_first(tmp_path, capsys):
    out = tmp_path / "run"
    first = popen([*S2S, "--steps", "100000", "--eval-every", "5", "--out", str(out)])
    try:
        # written after the first 5 steps (so that --resume, checked earlier, finds it)
        _wait_until((out / "checkpoint.pt").exists, first, "the first run")
        for extra in (["--force"], ["--resume"], []):
            code = in_process([*S2S, "--steps", "2", *extra, "--out", out])
            err = capsys.readouterr().err
            one_line(code, err, 2, "--out", "in use by another attnkit run", f"pid {first.pid}")
        assert first.poll() is None  # the first run goes on undisturbed
    finally:
        first.kill()
        first.communicate()
    assert in_process([*S2S, "--steps", "2", "--eval-every", "2", "--force", "--out", out]) == 0
    # the folder was free again once its run had gone


def test_the_lock_writes_nothing_and_torchrun_ranks_share_it(tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    out.mkdir()
    holder = popen([str(out)], script=HOLD)
    try:
        _wait_until(lambda: holder.stdout.readline() == b"HOLDING\n", holder, "the holder")
        assert list(out.iterdir()) == []  # the lock is on the folder itself: no file in it
        code = in_process([*EXPLAIN, "--out", out])
        one_line(code, capsys.readouterr().err, 2, "--out", f"pid {holder.pid}")
        with monkeypatch.context() as env:
            env.setenv("RANK", "1")  # another rank of the same torchrun launch
            assert in_process([*EXPLAIN, "--out", out]) == 0
    finally:
        holder.kill()
        holder.communicate()
    assert in_process([*EXPLAIN, "--out", out]) == 0
    assert in_process([*EXPLAIN, "--out", out]) == 0  # released by the run before
