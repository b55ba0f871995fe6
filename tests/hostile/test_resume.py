"""`--resume` finishes the steps asked for (issue 28, item 4). A run cut short by its step
budget inside an epoch used to count that epoch as done: `seq2seq train --steps 200
--resume` after 120 steps (evaluating every 50) stopped at step 170 with exit 0, and
`train --epochs 2 --resume` after `--max-steps 3` stopped one partial epoch short.
(`lm train` has no --resume: it always trains from the start.)"""

from __future__ import annotations

import json

from tests.hostile.cli import in_process

S2S = ["seq2seq", "train", "--min-len", "3", "--max-len", "5", "--num-symbols", "5",
       "--batch-size", "8", "--eval-size", "4", "--eval-every", "5", "--no-progress"]  # fmt: skip


def _history(folder) -> list[tuple[int, int]]:
    rows = json.loads((folder / "metrics.json").read_text())["history"]
    return [(row["epoch"], row["step"]) for row in rows]


def test_seq2seq_resume_reaches_the_steps_asked_for(tmp_path):
    out = tmp_path / "run"
    assert in_process([*S2S, "--steps", "12", "--out", out]) == 0
    assert in_process([*S2S, "--steps", "20", "--resume", "--out", out]) == 0
    # the cut third epoch is finished first, so the evaluations stay every 5 steps
    assert _history(out) == [(1, 5), (2, 10), (3, 12), (3, 15), (4, 20)]
    assert json.loads((out / "metrics.json").read_text())["step"] == 20


def test_train_resume_finishes_the_epochs_asked_for(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "cnn", "--epochs", "2", "--batch-size", "256", "--no-progress", "--out", out]
    assert in_process([*argv, "--max-steps", "3"]) == 0  # 1,437 images: 6 steps an epoch
    assert in_process([*argv, "--resume", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 12 and summary["epochs"] == 2
    assert _history(out) == [(1, 3), (1, 6), (2, 12)]
