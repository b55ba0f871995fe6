"""The context-parallel training demo: 2 gloo processes train exactly as one process does.

One spawn of 2 ranks runs `train_demo.main` at a tiny size on a sequence whose estimated
activations exceed the per-process budget while each rank's half fits; the test then trains
the same `GPT` on the full sequences in this process with `GPT.loss` and compares every
step's loss and the final weights.
"""

import json
import os

import pytest
import torch
import torch.distributed as dist

from attnkit.distributed import train_demo
from attnkit.models.gpt import GPT
from attnkit.train.loop import read_checkpoint
from tests.distributed._spawn import free_port, run

ARGS = [
    "--seq-len", "32", "--steps", "6", "--width", "16", "--heads", "2", "--vocab", "8",
    "--batch", "2", "--lr", "1e-2", "--checkpoint-every", "4", "--layout", "zigzag",
]  # fmt: skip


def _budget() -> str:
    """Between one rank's estimate (16 tokens) and one process's (32 tokens)."""
    args = train_demo.parse(["--out", "x", *ARGS])
    return str((train_demo.activation_mib(args, 16) + train_demo.activation_mib(args, 32)) / 2)


def _worker(rank: int, world: int, port: int, argv: list[str]) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )  # fmt: skip
    torch.set_num_threads(1)
    try:
        train_demo.main(argv)
    finally:
        dist.destroy_process_group()


def _reference(argv: list[str], steps: int) -> tuple[list[float], GPT]:
    """The same model trained on the full sequences in one process, with GPT's own loss."""
    args = train_demo.parse(argv)
    model = train_demo.build(args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step in range(steps):
        ids = train_demo.batch(args.seed, step, args.batch, args.seq_len, args.vocab, args.period)
        loss = model.loss(ids)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp") / "run"
    argv = ["--out", str(out), *ARGS, "--budget-mib", _budget()]
    run(_worker, args=(2, free_port(), argv), nprocs=2)
    return out, argv


def test_two_ranks_train_exactly_like_one_process_on_the_full_sequence(two_ranks):
    out, argv = two_ranks
    metrics = json.loads((out / "metrics.json").read_text())
    got = [row["loss"] for row in metrics["history"]]
    want, model = _reference(argv, 6)
    assert metrics["world"] == 2 and metrics["tokens_per_rank"] == 16
    assert metrics["activation_mib_one_process_estimate"] > float(_budget())
    assert metrics["activation_mib_per_rank_estimate"] <= float(_budget())
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
    assert got[-1] < got[0] - 0.2, got  # it learns
    state = read_checkpoint(out / "checkpoint.pt")
    assert state["step"] == 6
    plain = GPT(model.cfg)  # the checkpoint is a plain GPT state dict
    plain.load_state_dict(state["model"])
    # compared as functions, not weight by weight: the key projection's bias has a gradient
    # of exactly 0 in theory (it shifts a row's scores by a constant), so Adam turns rounding
    # noise into steps of size lr there, differently in each run, without changing any output
    ids = train_demo.batch(99, 0, 2, 32, 8, 16)[:, :-1]  # (B, N)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids), model(ids), rtol=1e-4, atol=1e-4)


def test_one_process_resume_continues_the_same_run(tmp_path, capsys):
    base = [*ARGS[:2], "--width", "16", "--heads", "2", "--vocab", "8", "--budget-mib", "100"]
    straight = train_demo.main(["--out", str(tmp_path / "a"), *base, "--steps", "4"])
    train_demo.main(["--out", str(tmp_path / "b"), *base, "--steps", "2"])
    resumed = train_demo.main(["--out", str(tmp_path / "b"), *base, "--steps", "4", "--resume"])
    assert [r["loss"] for r in resumed["history"]] == [r["loss"] for r in straight["history"]]
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("done: 4 steps, loss")
    assert sum(line.startswith("step ") for line in lines) == 4 + 2 + 2  # one line per step
    with pytest.raises(SystemExit) as e:  # a finished run is not overwritten by accident
        train_demo.main(["--out", str(tmp_path / "b"), *base, "--steps", "4"])
    assert e.value.code == 2


@pytest.mark.parametrize(
    ("extra", "env", "message"),
    [
        (["--budget-mib", "0.001"], "1", "--budget-mib 0.001: 32 tokens per rank need"),
        (["--seq-len", "30"], "2", "--seq-len 30 must be divisible by 4 (2 ranks, layout zigzag)"),
        (["--heads", "3"], "1", "--width 16 must be divisible by --heads 3"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, monkeypatch, capsys, extra, env, message):
    monkeypatch.setenv("WORLD_SIZE", env)
    argv = ["--out", str(tmp_path), "--seq-len", "32", "--width", "16", "--budget-mib", "100"]
    with pytest.raises(SystemExit) as e:
        train_demo.main([*argv, *extra])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("train_demo: error: ") and message in err
