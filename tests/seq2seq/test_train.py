from __future__ import annotations

import json

import pytest
import torch

from attnkit.cli.main import main
from attnkit.seq2seq import (
    Task,
    TrainConfig,
    build_model,
    cross_attention,
    heldout,
    load_checkpoint,
    mirror_accuracy,
    train,
)
from attnkit.seq2seq.tasks import BOS, EOS, PAD

SMOKE = ["--min-len", "3", "--max-len", "5", "--num-symbols", "5", "--batch-size", "16"]
SMOKE += ["--eval-size", "20", "--eval-every", "5", "--no-progress"]


def test_cli_smoke_train_resume_decode(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(["seq2seq", "train", "--task", "reverse", "--out", str(out), "--steps", "5", *SMOKE])
        == 0
    )
    names = {p.name for p in out.iterdir()}
    assert {"checkpoint.pt", "config.json", "metrics.json"} <= names
    assert any(n.startswith("alignment_") and n.endswith(".png") for n in names)
    assert not [n for n in names if n.endswith(".tmp")]  # atomic writes leave no temp files
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["step"] == 5 and 0.0 <= metrics["exact_match"] <= 1.0
    config = json.loads((out / "config.json").read_text())
    run = config["run"]  # fit's config.json: the run_info, then fit's settings
    assert run["task"]["name"] == "reverse" and run["model"]["d_model"] == 64
    assert run["heldout"]["size"] == 20 and config["train"]["max_steps"] == 5

    argv = ["seq2seq", "train", "--task", "reverse", "--out", str(out), "--steps", "10", "--resume"]
    assert main([*argv, *SMOKE]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["step"] == 10 and [h["step"] for h in metrics["history"]] == [5, 10]

    capsys.readouterr()
    assert main(["seq2seq", "train", "--out", str(out), "--steps", "5", *SMOKE]) == 2
    assert "already holds checkpoint.pt, config.json, metrics.json: pass --force" in (
        capsys.readouterr().err
    )
    assert main(["seq2seq", "decode", str(out), "abc", "ed", "--beam", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["abc", "ed"]


def _main(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["seq2seq", "decode", "/nonexistent/run", "abc"], "no file /nonexistent/run"),
        (["seq2seq", "train", "--resume"], "resume: no checkpoint at attnkit-out/seq2seq"),
        (["seq2seq", "train", "--steps", "0", "--no-progress"], "--steps/--max-steps: must be"),
        (["seq2seq", "train", "--num-symbols", "40"], "num_symbols must be in [2, 26], got 40"),
        (["seq2seq", "train", "--warmup", "-1"], "warmup >= 0"),
    ],
)
def test_cli_errors_exit_2_with_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_cli_decode_rejects_unknown_symbols(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["seq2seq", "train", "--out", str(out), "--steps", "1", *SMOKE]) == 0
    capsys.readouterr()
    assert main(["seq2seq", "decode", str(out), "abz"]) == 2
    assert "symbols ['z'] outside" in capsys.readouterr().err


def test_resume_refuses_a_different_task(tmp_path):
    task = Task("reverse", min_len=2, max_len=3, num_symbols=4)
    cfg = TrainConfig(steps=2, eval_every=2, eval_size=4, batch_size=4)
    train(task, cfg=cfg, out=tmp_path, progress=False, alignments=0)
    other = Task("copy", min_len=2, max_len=3, num_symbols=4)
    with pytest.raises(ValueError, match=r"different settings for \['task'\]"):
        train(other, cfg=cfg, out=tmp_path, resume=True, progress=False)


# A reverse model trained for ~30-40 s on 2 shared CPU cores (600 steps; at 400
# the best head was at 0.90, its misses one position to the right): its
# cross-attention must show the alignment (output t reads source n - 1 - t).
ALIGN_TASK = Task("reverse", min_len=4, max_len=8, num_symbols=8)


@pytest.fixture(scope="module")
def reverse_model():
    torch.manual_seed(0)
    model_cfg = build_model(ALIGN_TASK, d_model=64, d_ff=128, num_heads=4).cfg
    cfg = TrainConfig(
        steps=600, batch_size=32, lr=2e-3, warmup=50, eval_every=300, eval_size=100, stop_at=1.01
    )
    model, metrics = train(ALIGN_TASK, model_cfg, cfg, progress=False, alignments=0)
    return model, metrics


@pytest.mark.slow
def test_trained_reverse_model_decodes_and_aligns(reverse_model):
    model, metrics = reverse_model
    assert metrics["exact_match"] >= 0.95, metrics
    src, tgt = heldout(ALIGN_TASK, 100, seed=77)
    maps = cross_attention(model, src, tgt[:, :-1])  # (L, B, H, T, S)
    lengths = (src != PAD).sum(1) - 1  # symbols, without EOS
    score = mirror_accuracy(maps, lengths)  # (L, H)
    assert score.max() >= 0.9, score


@pytest.mark.slow
def test_checkpoint_round_trip(tmp_path, reverse_model):
    model, _ = reverse_model
    task = ALIGN_TASK
    torch.save(
        {"model": model.state_dict(), "model_config": model.cfg.to_dict(), "task": task.to_dict()},
        tmp_path / "checkpoint.pt",
    )
    loaded, loaded_task = load_checkpoint(tmp_path)
    assert loaded_task == task
    src = torch.tensor([[*task.encode("abcd"), EOS]])
    a = loaded(src, torch.tensor([[BOS, 3]]))
    torch.testing.assert_close(a, model(src, torch.tensor([[BOS, 3]])))


def test_cli_max_time_stops_inside_an_interval_and_resume_ends_as_a_straight_run(
    tmp_path, capsys, monkeypatch
):
    """A fake clock (one second per call: the start, then once after every step) runs out
    during step 3 of --max-time 3, inside the first evaluation interval; --resume ends where
    a run that never stopped ends (dropout draws included)."""
    import itertools

    from attnkit.train import loop

    argv = ["seq2seq", "train", "--task", "reverse", "--steps", "10", *SMOKE]
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert main([*argv, "--out", str(straight), "--quiet"]) == 0
    monkeypatch.setattr(loop, "_clock", itertools.count().__next__)
    capsys.readouterr()
    assert main([*argv, "--out", str(cut), "--max-time", "3"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("attnkit seq2seq train: stopped by --max-time at step 3 of 10: ")
    assert line.endswith(f"(20 held-out); wrote {cut}/ (--resume continues)")
    metrics = json.loads((cut / "metrics.json").read_text())
    assert metrics["stopped"] == "max-time" and metrics["step"] == 3 and metrics["history"] == []
    assert main([*argv, "--out", str(cut), "--resume", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stopped"] is None and summary["step"] == summary["steps"] == 10
    a, b = (torch.load(d / "checkpoint.pt", weights_only=True)["model"] for d in (straight, cut))
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads((d / "metrics.json").read_text())["history"] for d in (straight, cut)]
    kept = [[(r["step"], r["exact_match"], r["train_loss"]) for r in h] for h in rows]
    assert kept[0] == kept[1] and [r["step"] for r in rows[1]] == [5, 10]
