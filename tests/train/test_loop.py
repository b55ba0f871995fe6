import json

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from attnkit._io import atomic_save
from attnkit.models.vit import ViT, ViTConfig
from attnkit.train.data import classify_step, evaluate_classifier, load_digits
from attnkit.train.loop import StepResult, TrainConfig, fit

TINY = ViTConfig(image_size=8, dim=16, depth=1, num_heads=2, mlp_ratio=1.0, dropout=0.0)


def test_atomic_save_replaces_and_interrupted_write_keeps_old(tmp_path, monkeypatch):
    path = tmp_path / "ck.pt"
    atomic_save(path, {"a": 1})
    atomic_save(path, {"a": 2})
    assert torch.load(path)["a"] == 2

    def crash(obj, buffer):
        buffer.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        atomic_save(path, {"a": 3})
    monkeypatch.undo()
    assert torch.load(path)["a"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"]


def _digits_subset(n=128):
    d = load_digits()
    x, y = d.train.tensors
    return TensorDataset(x[:n], y[:n]), d


def test_smoke_training_writes_run_directory(tmp_path):
    train, d = _digits_subset()
    torch.manual_seed(0)
    model = ViT(TINY)
    before = [p.detach().clone() for p in model.parameters()]
    result = fit(
        model,
        classify_step(),
        train,
        config=TrainConfig(epochs=2, batch_size=32, max_steps=5),
        out_dir=tmp_path,
        evaluate=lambda m: evaluate_classifier(m, d.test),
        run_info={"model": "tiny"},
        progress=False,
    )
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert result.history[-1]["step"] == 5
    assert {"train_loss", "train_acc", "test_acc", "test_loss", "lr"} <= set(result.history[0])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.pt",
        "config.json",
        "metrics.json",
    ]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["params"] == result.params and len(metrics["history"]) == 2
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["run"] == {"model": "tiny"} and config["train"]["max_steps"] == 5


def _run(tmp_path, evaluate=None, resume=False, epochs=3):
    train, _ = _digits_subset(64)
    torch.manual_seed(0)
    model = ViT(TINY)
    fit(
        model,
        classify_step(augment=lambda x: x + 0.1 * torch.randn_like(x)),  # uses the RNG
        train,
        config=TrainConfig(epochs=epochs, batch_size=16),
        out_dir=tmp_path,
        evaluate=evaluate,
        resume=resume,
        run_info={"model": "tiny"},
        progress=False,
    )
    return model


def test_ctrl_c_keeps_last_checkpoint_and_resume_matches_uninterrupted_run(tmp_path):
    straight = _run(tmp_path / "a")

    def interrupt_in_epoch_3(model):
        if len(json.loads((tmp_path / "b" / "metrics.json").read_text())["history"]) == 2:
            raise KeyboardInterrupt
        return {}

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "metrics.json").write_text('{"history": []}')
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "b", evaluate=interrupt_in_epoch_3)
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["epoch"] == 2
    resumed = _run(tmp_path / "b", resume=True)
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    history = json.loads((tmp_path / "b" / "metrics.json").read_text())["history"]
    assert [row["epoch"] for row in history] == [1, 2, 3]


def test_resume_and_overwrite_errors(tmp_path):
    train, _ = _digits_subset(32)
    kw = dict(config=TrainConfig(epochs=1, batch_size=16), progress=False)
    with pytest.raises(ValueError, match="resume: no checkpoint at"):
        fit(ViT(TINY), classify_step(), train, out_dir=tmp_path, resume=True, **kw)
    fit(ViT(TINY), classify_step(), train, out_dir=tmp_path, run_info={"m": 1}, **kw)
    with pytest.raises(ValueError, match=r"already holds checkpoint\.pt; pass resume=True"):
        fit(ViT(TINY), classify_step(), train, out_dir=tmp_path, **kw)
    with pytest.raises(ValueError, match=r"different settings for \['m'\]"):
        fit(
            ViT(TINY),
            classify_step(),
            train,
            out_dir=tmp_path,
            resume=True,
            run_info={"m": 2},
            **kw,
        )


def test_generic_step_without_accuracy():
    """The loop knows nothing about classification: a regression step works too."""
    x = torch.randn(40, 3)
    data = TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5]))
    model = nn.Linear(3, 1)

    def step(m, batch):
        xb, yb = batch
        return StepResult(nn.functional.mse_loss(m(xb)[:, 0], yb), len(yb))

    result = fit(
        model, step, data, config=TrainConfig(epochs=30, batch_size=8, lr=0.05), progress=False
    )
    assert "train_acc" not in result.history[-1]
    assert result.history[-1]["train_loss"] < 0.1 * result.history[0]["train_loss"]


class _EpochAwareData(TensorDataset):
    """Records the epochs `fit` announces (a generated dataset would redraw its items)."""

    def __init__(self, *tensors):
        super().__init__(*tensors)
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)


def test_stop_when_ends_the_run_and_dataset_hears_each_epoch(tmp_path):
    x = torch.randn(16, 3)
    data = _EpochAwareData(x, x.sum(1))
    model = nn.Linear(3, 1)

    def step(m, batch):
        xb, yb = batch
        return StepResult(nn.functional.mse_loss(m(xb)[:, 0], yb), len(yb))

    result = fit(
        model,
        step,
        data,
        config=TrainConfig(epochs=5, batch_size=8),
        out_dir=tmp_path,
        evaluate=lambda m: {"score": 0.5},
        stop_when=lambda row: row["epoch"] >= 2 and row["score"] > 0.4,
        progress=False,
    )
    assert [row["epoch"] for row in result.history] == [1, 2]
    assert data.epochs == [0, 1]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    # the latest row sits at the top level for a quick look
    assert metrics["step"] == 4 and metrics["score"] == 0.5 and metrics["epoch"] == 2
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["epoch"] == 2


def test_max_steps_is_the_schedule_budget():
    """With max_steps the cosine schedule ends (lr 0) at the cap, not after all epochs."""
    x = torch.randn(16, 3)
    model = nn.Linear(3, 1)

    def step(m, batch):
        xb, yb = batch
        return StepResult(nn.functional.mse_loss(m(xb)[:, 0], yb), len(yb))

    config = TrainConfig(epochs=10, batch_size=8, max_steps=5)
    result = fit(model, step, TensorDataset(x, x.sum(1)), config=config, progress=False)
    assert [row["step"] for row in result.history] == [2, 4, 5]
    assert result.history[-1]["lr"] == pytest.approx(0.0, abs=1e-12)
