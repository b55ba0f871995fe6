"""`attnkit lm train|sample` through `main([...])` on tiny sizes."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.cli.lm import load_lm
from attnkit.cli.main import main

TINY = ["--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "4", "--context", "16",
        "--layers", "1", "--heads", "2", "--d-model", "16", "--threads", "1"]  # fmt: skip
TEXT = "the cat sat on the mat. the dog sat on the log. " * 20


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    (root / "t.txt").write_text(TEXT)
    code = main(["lm", "train", "--text", str(root / "t.txt"), "--out", str(root / "run"), *TINY])
    assert code == 0
    return root


def test_train_writes_a_checkpoint_and_held_out_loss_per_epoch(trained):
    history = json.loads((trained / "run" / "history.json").read_text())
    assert [h["epoch"] for h in history["history"]] == [1, 2]
    assert history["vocab_size"] == len(set(TEXT)) and history["chars"] == len(TEXT)
    for h in history["history"]:
        assert 0 < h["held_out_loss"] < 10 and 0 < h["train_loss"] < 10
    model, tokenizer = load_lm(trained / "run")
    assert tokenizer.vocab == "".join(sorted(set(TEXT))) and model.cfg.context == 16
    assert not model.training


def test_train_output_progress_and_json(tmp_path, capsys):
    (tmp_path / "t.txt").write_text(TEXT)
    out = tmp_path / "run"
    assert main(["lm", "train", "--text", str(tmp_path / "t.txt"), "--out", str(out), *TINY]) == 0
    captured = capsys.readouterr()
    assert "lm train: 100%" in captured.err and "[lm] epoch 2/2:" in captured.err
    assert "held-out loss" in captured.err
    last = captured.out.strip().splitlines()[-1]
    assert (
        last.startswith("attnkit lm train: held-out loss ") and str(out / "checkpoint.pt") in last
    )
    # the folder holds results now: refused without --force, one line, exit 2
    argv = ["lm", "train", "--text", str(tmp_path / "t.txt"), "--out", str(out), *TINY]
    assert main(argv) == 2
    assert "--force" in capsys.readouterr().err
    assert main([*argv, "--force", "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["command"] == "lm train" and summary["epochs"] == 2
    assert summary["held_out_loss"] > 0 and summary["files"][0].endswith("checkpoint.pt")


def test_sample_continues_the_prompt_reproducibly(trained, capsys):
    argv = ["lm", "sample", "--checkpoint", str(trained / "run"), "--prompt", "the ca",
            "--max-new-tokens", "12", "--seed", "3"]  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr().out.rstrip("\n")
    assert main(argv) == 0
    assert capsys.readouterr().out.rstrip("\n") == first
    assert first.startswith("the ca") and len(first) == 6 + 12


def test_greedy_sample_is_the_models_greedy_generation(trained, capsys):
    argv = ["lm", "sample", "--checkpoint", str(trained / "run"), "--prompt", "the dog",
            "--max-new-tokens", "10", "--temperature", "0", "--json"]  # fmt: skip
    assert main(argv) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    model, tokenizer = load_lm(trained / "run")
    ids = torch.tensor([tokenizer.encode("the dog")])
    assert text == tokenizer.decode(model.generate(ids, 10)[0].tolist())


def test_prompt_with_unknown_characters_is_one_line_exit_2(trained, capsys):
    argv = ["lm", "sample", "--checkpoint", str(trained / "run"), "--prompt", "Zebra ☃"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--prompt" in err and "Z" in err and "☃" in err


def test_default_corpus_is_the_standard_library_read_deterministically():
    from attnkit.train.corpus import read_corpus

    a, b = read_corpus(None, 20_000), read_corpus(None, 20_000)
    assert a.text == b.text and len(a.text) == 20_000 and a.kind == "files"
    assert "standard library" in a.source and "import" in a.text


def test_rotary_model_trains_saves_and_samples(tmp_path, capsys):
    (tmp_path / "t.txt").write_text(TEXT)
    out = tmp_path / "rope"
    argv = ["lm", "train", "--text", str(tmp_path / "t.txt"), "--out", str(out), "--rotary"]
    assert main([*argv, *TINY, "--quiet"]) == 0
    model, tokenizer = load_lm(out)
    assert model.cfg.rotary and model.positions is None
    sample = ["lm", "sample", "--checkpoint", str(out), "--prompt", "the", "--temperature", "0"]
    assert main([*sample, "--max-new-tokens", "5", "--json"]) == 0
    text = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]
    ids = torch.tensor([tokenizer.encode("the")])
    assert text == tokenizer.decode(model.generate(ids, 5)[0].tolist())


@pytest.mark.parametrize("group", ["lm", "seq2seq"])
def test_a_command_group_without_a_subcommand_prints_its_help_and_exits_2(group, capsys):
    assert main([group]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"usage: attnkit {group}" in captured.err
    assert "COMMAND" in captured.err


PARAGRAPHS = "".join(
    f"{'the cat sat on the mat. ' * (1 + i % 5)}\n\n{'the dog. ' * (1 + i % 3)}\n  \n\n"
    for i in range(40)
)


@pytest.mark.parametrize("pack", [True, False], ids=["pack", "windows"])
def test_max_steps_stops_training_and_pack_trains_on_packed_paragraphs(
    pack, tmp_path, capsys, monkeypatch
):
    """--pack: every step's rows carry document ids that restart at each paragraph (the
    model's loss gets them); --max-steps 2 ends the run inside its first epoch."""
    from attnkit.models import GPT

    seen = []
    loss = GPT.loss

    def spy(self, ids, **kw):
        if self.training:
            seen.append((ids, kw.get("document_ids")))
        return loss(self, ids, **kw)

    monkeypatch.setattr(GPT, "loss", spy)
    (tmp_path / "p.txt").write_text(PARAGRAPHS)
    argv = ["lm", "train", "--text", str(tmp_path / "p.txt"), "--out", str(tmp_path / "run")]
    argv += [*TINY, "--max-steps", "2", "--json", "--quiet"] + (["--pack"] if pack else [])
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pack"] is pack and summary["steps"] == 2 and summary["epochs"] == 1
    assert 0 < summary["held_out_loss"] < 10
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["pack"] is pack and [h["steps"] for h in history["history"]] == [2]
    assert len(seen) == 2
    _, tokenizer = load_lm(tmp_path / "run")
    for ids, docs in seen:
        assert ids.shape == (4, 17)  # --batch-size 4, --context 16 + 1
        if not pack:
            assert docs is None
            continue
        for row, row_docs in zip(ids.tolist(), docs.tolist(), strict=True):
            text = tokenizer.decode(row)
            # a new document starts exactly after each run of blank lines
            for t in range(1, 17):
                after_blank = text[:t].endswith("\n\n") and text[t] not in "\n "
                assert (row_docs[t] != row_docs[t - 1]) == after_blank, (text, row_docs)


def _train_argv(tmp_path, out: str, *extra: str) -> list[str]:
    (tmp_path / "t.txt").write_text(TEXT)
    return ["lm", "train", "--text", str(tmp_path / "t.txt"), "--out", str(tmp_path / out),
            *TINY, "--quiet", *extra]  # fmt: skip


def _same_run(a, b) -> None:
    """Two checkpoints of one run: equal weights, optimizer, schedule, random states and
    history (the seconds aside), bit for bit."""
    sa, sb = (torch.load(p / "checkpoint.pt", weights_only=True) for p in (a, b))
    for key in ("model", "optimizer", "scheduler"):
        flat_a, flat_b = (torch.utils._pytree.tree_flatten(s[key])[0] for s in (sa, sb))
        assert len(flat_a) == len(flat_b)
        for x, y in zip(flat_a, flat_b, strict=True):
            assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, key
    assert torch.equal(sa["generator"], sb["generator"]) and torch.equal(sa["rng"], sb["rng"])
    assert sa["step"] == sb["step"] and sa["epoch"] == sb["epoch"]
    drop = [
        [{k: v for k, v in h.items() if k != "seconds"} for h in s["history"]] for s in (sa, sb)
    ]
    assert drop[0] == drop[1]


def test_max_time_stops_inside_an_epoch_and_resume_continues_exactly(tmp_path, capsys):
    """--max-time (tiny: one step) stops at step 1, then 2; --resume goes on to the end; the
    result is bit for bit the run that was never stopped (its schedule is the whole run's)."""
    assert main(_train_argv(tmp_path, "straight")) == 0
    argv = _train_argv(tmp_path, "stopped")
    assert main([*argv, "--max-time", "1e-9"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("attnkit lm train: stopped by --max-time at step 1 of 6, held-out")
    assert "(--resume continues)" in line
    history = json.loads((tmp_path / "stopped" / "history.json").read_text())
    assert history["history"] == [] and history["stopped"]["step"] == 1
    assert main([*argv, "--resume", "--max-time", "1e-9", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stopped"] == "max-time" and summary["steps"] == 2
    assert main([*argv, "--resume"]) == 0
    _same_run(tmp_path / "straight", tmp_path / "stopped")


def test_ctrl_c_names_the_kept_checkpoint_and_resume_continues_exactly(
    tmp_path, capsys, monkeypatch
):
    """Ctrl-C at the 5th step (epoch 2 of 3-step epochs): exit 130, the message names the
    checkpoint of epoch 1 (step 3); --resume from it ends where the uninterrupted run does."""
    from attnkit.models import GPT

    assert main(_train_argv(tmp_path, "straight")) == 0
    calls, loss = [], GPT.loss

    def interrupted(self, ids, **kw):
        if self.training:
            calls.append(1)
            if len(calls) == 5:
                raise KeyboardInterrupt
        return loss(self, ids, **kw)

    monkeypatch.setattr(GPT, "loss", interrupted)
    argv = _train_argv(tmp_path, "cut")
    capsys.readouterr()
    assert main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    kept = tmp_path / "cut" / "checkpoint.pt"
    assert err == (
        f"attnkit lm train: interrupted; kept {kept} (step 3, epoch 1); --resume continues from it"
    )
    assert torch.load(kept, weights_only=True)["step"] == 3
    monkeypatch.setattr(GPT, "loss", loss)
    assert main([*argv, "--resume"]) == 0
    _same_run(tmp_path / "straight", tmp_path / "cut")


def test_resume_refuses_what_it_cannot_continue(tmp_path, capsys):
    argv = _train_argv(tmp_path, "run")
    assert main([*argv, "--resume"]) == 2  # nothing to resume yet
    assert "no checkpoint" in capsys.readouterr().err
    assert main(argv) == 0
    cases = {
        ("--resume", "--force"): "pick one",
        ("--resume",): "all of the 6 of its schedule",
        ("--resume", "--epochs", "3", "--lr", "0.01"): "lr 0.003 there, 0.01 now",
        ("--resume", "--epochs", "3", "--d-model", "32"): "other d_model",
    }
    for extra, says in cases.items():
        assert main([*argv, *extra]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and says in err, (extra, err)
    # more epochs: training goes on from step 6 (the schedule now ends at step 9)
    assert main([*argv, "--resume", "--epochs", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 9 and summary["epochs"] == 3 and summary["stopped"] is None


def test_ctrl_c_after_a_stop_inside_an_epoch_says_how_far_into_it(tmp_path, capsys, monkeypatch):
    from attnkit.models import GPT

    argv = _train_argv(tmp_path, "run")
    assert main([*argv, "--max-time", "1e-9"]) == 0  # step 1 of epoch 1's 3
    monkeypatch.setattr(GPT, "loss", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    kept = tmp_path / "run" / "checkpoint.pt"
    assert err.endswith(f"kept {kept} (step 1, epoch 1 after 1 of its 3 steps); --resume "
                        "continues from it")  # fmt: skip


def test_ctrl_c_before_the_first_checkpoint_says_nothing_was_kept(tmp_path, capsys, monkeypatch):
    from attnkit.models import GPT

    monkeypatch.setattr(GPT, "loss", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(_train_argv(tmp_path, "run")) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "attnkit lm train: interrupted; no checkpoint was written yet (the first is at the end "
        "of epoch 1)"
    )
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
