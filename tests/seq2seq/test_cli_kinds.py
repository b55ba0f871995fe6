"""`attnkit seq2seq train --model rnn|universal`, and decode/eval loading a run by its kind."""

from __future__ import annotations

import json

import torch

from attnkit.cli.main import main
from attnkit.models import Transformer
from attnkit.models.rnn import RNNSeq2Seq
from attnkit.models.universal import UniversalTransformer
from attnkit.seq2seq import Task, TrainConfig, load_checkpoint, train

SMOKE = ["--min-len", "3", "--max-len", "5", "--num-symbols", "5", "--batch-size", "8"]
SMOKE += ["--eval-size", "8", "--eval-every", "2", "--steps", "2"]


def test_rnn_run_records_its_kind_and_decode_and_eval_load_it(tmp_path, capsys):
    out = tmp_path / "rnn"
    argv = ["seq2seq", "train", "--model", "rnn", "--cell", "lstm", "--attention", "dot"]
    assert main([*argv, "--out", str(out), "--json", *SMOKE]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # --json: one JSON object and nothing else
    assert summary["model"] == "rnn" and summary["step"] == 2 and summary["out"] == str(out)
    assert "epoch" not in captured.err  # no progress with --json
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["run_info"]["kind"] == "rnn"
    assert state["run_info"]["model"]["cell"] == "lstm"
    assert (out / "alignment_0.png").is_file()
    model, task = load_checkpoint(out)
    assert isinstance(model, RNNSeq2Seq) and model.cfg.attention == "dot" and task.max_len == 5

    assert main(["seq2seq", "decode", str(out), "abc", "eda", "--beam", "2", "--json"]) == 0
    decoded = json.loads(capsys.readouterr().out)["decoded"]
    assert [d["source"] for d in decoded] == ["abc", "eda"]
    assert main(["seq2seq", "eval", str(out), "--by-length", "--eval-size", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["by_length"]) == {"3", "4", "5"} and 0 <= result["exact_match"] <= 1


def test_rnn_without_attention_draws_no_alignment(tmp_path, capsys):
    out = tmp_path / "none"
    argv = ["seq2seq", "train", "--model", "rnn", "--attention", "none", "--quiet"]
    assert main([*argv, "--out", str(out), *SMOKE]) == 0
    assert not list(out.glob("alignment_*.png"))
    capsys.readouterr()
    code = main(["seq2seq", "decode", str(out), "abc", "--alignment-dir", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert code == 2 and "--alignment-dir" in err and "no attention" in err
    assert not (tmp_path / "a").exists()


def test_universal_act_summary_line_quiet_and_force(tmp_path, capsys):
    out = tmp_path / "ut"
    argv = ["seq2seq", "train", "--model", "universal", "--act", "--ut-steps", "2"]
    assert main([*argv, "--out", str(out), "--quiet", *SMOKE]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "attnkit seq2seq train: universal (2 steps, ACT) on reverse: exact match "
    )
    assert lines[0].endswith(f"wrote {out}/") and captured.err == ""  # --quiet: no progress
    model, _ = load_checkpoint(out)
    assert isinstance(model, UniversalTransformer) and model.cfg.act and model.cfg.steps == 2
    # a second run into the same folder is refused, then replaces it with --force
    assert main([*argv, "--out", str(out), "--quiet", *SMOKE]) == 2
    assert "--force" in capsys.readouterr().err
    assert main([*argv, "--out", str(out), "--quiet", "--force", *SMOKE]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [h["step"] for h in metrics["history"]] == [2]  # a fresh run, not a continuation


def test_a_checkpoint_without_a_kind_is_a_transformer(tmp_path):
    task = Task("reverse", min_len=2, max_len=3, num_symbols=4)
    cfg = TrainConfig(steps=1, eval_every=1, eval_size=2, batch_size=2)
    trained, _ = train(task, cfg=cfg, out=tmp_path, progress=False, alignments=0)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    del state["run_info"]["kind"]  # as written before the RNN and Universal Transformer
    torch.save(state, tmp_path / "checkpoint.pt")
    model, loaded_task = load_checkpoint(tmp_path)
    assert isinstance(model, Transformer) and loaded_task == task
    src, tgt = torch.tensor([[3, 4, 2]]), torch.tensor([[1, 4]])
    torch.testing.assert_close(model(src, tgt), trained(src, tgt))
