"""`attnkit lm train` on the user's own documents: a folder (one file = one document) packed,
a BPE tokenizer saved with the checkpoint and used by `lm sample`, --max-steps as the
schedule's length, and --max-time fitting the schedule to the time (a fake clock)."""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.cli import _lm_train
from attnkit.cli.lm import load_lm
from attnkit.cli.main import main

TINY = ["--steps-per-epoch", "3", "--batch-size", "4", "--context", "16", "--layers", "1",
        "--heads", "2", "--d-model", "16", "--threads", "1"]  # fmt: skip


@pytest.fixture
def repo(tmp_path):
    """A folder of source files with blank lines inside them: 6 documents, whatever blank
    lines they hold."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    for i in range(6):
        body = f"def f{i}(x):\n    return x + {i}\n\n\n" * (3 + i) + f"# end of file {i}\n"
        (root / "pkg" / f"m{i}.py").write_text(body)
    return root


def test_a_folder_packs_one_file_per_document_with_bpe(repo, tmp_path, capsys, monkeypatch):
    from attnkit.models import GPT

    seen, loss = [], GPT.loss

    def spy(self, ids, **kw):
        if self.training:
            seen.append(kw.get("document_ids"))
        return loss(self, ids, **kw)

    monkeypatch.setattr(GPT, "loss", spy)
    out = tmp_path / "run"
    argv = ["lm", "train", "--text", str(repo), "--out", str(out), "--pack", "--tokenizer",
            "bpe", "--vocab-size", "300", "--epochs", "1", *TINY]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert f"[lm] 6 documents (files) from {repo} (6 files): " in captured.err
    last = captured.out.strip().splitlines()[-1]
    assert "tokens/s" in last and "after 3 steps" in last
    # a row's document ids change only where a file starts: 6 files, rows of 17 tokens
    assert all(docs is not None and int(docs.max()) <= 1 for docs in seen)
    model, tokenizer = load_lm(out)
    assert tokenizer.kind == "bpe" and model.cfg.vocab_size == tokenizer.size <= 300
    sample = ["lm", "sample", "--checkpoint", str(out), "--prompt", "def f☃(", "--temperature",
              "0", "--max-new-tokens", "4", "--json"]  # fmt: skip
    assert main(sample) == 0  # any text encodes with byte-level BPE
    text = json.loads(capsys.readouterr().out)["text"]
    ids = torch.tensor([tokenizer.encode("def f☃(")])
    assert text == tokenizer.decode(model.generate(ids, 4)[0].tolist())


def test_json_summary_names_documents_tokenizer_and_speed(repo, tmp_path, capsys):
    argv = ["lm", "train", "--text", str(repo), "--out", str(tmp_path / "r"), "--epochs", "1",
            *TINY, "--json"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["documents"]["documents"] == 6 and summary["tokenizer"] == "char"
    assert summary["tokens_per_second"] > 0 and summary["train_tokens"] > 0


def test_max_steps_is_the_schedule_length_beyond_the_epochs(repo, tmp_path, capsys):
    argv = ["lm", "train", "--text", str(repo), "--out", str(tmp_path / "r"), "--epochs", "1",
            "--max-steps", "5", *TINY, "--json"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == summary["total_steps"] == 5 and summary["epochs"] == 2
    state = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)
    assert state["schedule"] == {"asked": 5, "total": 5}
    lr = state["scheduler"]["_last_lr"][0]
    assert lr == pytest.approx(3e-3 * 0.1)  # the cosine ended: a tenth of the peak


def test_max_time_fits_the_schedule_to_the_time(repo, tmp_path, capsys, monkeypatch):
    """A fake clock: 1 s per training step, evaluations free. 20 steps asked, 12 s given:
    one warm-up step, five timed ones (1 s each), then 0.97 · 6 s left: 5 more steps, so the
    schedule ends at step 11, inside the time, with the learning rate at its floor."""
    from attnkit.models import GPT

    clock, loss = [0.0], GPT.loss

    def timed(self, ids, **kw):
        if self.training:
            clock[0] += 1.0
        return loss(self, ids, **kw)

    monkeypatch.setattr(GPT, "loss", timed)
    monkeypatch.setattr(_lm_train, "_clock", lambda: clock[0])
    out = tmp_path / "timed"
    argv = ["lm", "train", "--text", str(repo), "--out", str(out), "--epochs", "4",
            "--steps-per-epoch", "5", *TINY[2:], "--max-time", "12"]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "the schedule fitted to 11 of 20 steps" in captured.err
    assert "after 11 steps (the schedule fitted to --max-time; 20 asked)" in captured.out
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["step"] == 11 and state["schedule"] == {"asked": 20, "total": 11}
    assert state["scheduler"]["_last_lr"][0] == pytest.approx(3e-3 * 0.1)


def test_fit_steps_plans_for_evaluations_and_stays_in_bounds():
    fit = _lm_train.fit_steps
    assert fit(6, 20, 6.0, 1.0, 0.0, 5) == 11
    # one evaluation at the end (1 s) and one per 5 steps (0.2 s a step): (5.82 - 1) / 1.2 = 4
    assert fit(6, 20, 6.0, 1.0, 1.0, 5) == 10
    assert fit(6, 8, 100.0, 1.0, 0.0, 5) == 8  # never past what was asked
    assert fit(6, 20, -3.0, 1.0, 0.0, 5) == 6  # the time is gone: end now


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--doc-sep", ""], "--doc-sep is empty"),
        (["--tokenizer", "bpe", "--vocab-size", "200"], "needs at least 257"),
    ],
)
def test_bad_document_and_tokenizer_options_are_one_line(repo, tmp_path, capsys, extra, says):
    argv = ["lm", "train", "--text", str(repo), "--out", str(tmp_path / "r"), *TINY, *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and says in err
