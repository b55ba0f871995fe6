"""The 8×8 handwritten digits (scikit-learn's copy of the UCI set, offline), augmentation,
and the classification step and evaluation used with `fit`.

Dimensions: B batch, I = 8 image side. Images are (1, 8, 8) float, labels long.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from attnkit._optional import require
from attnkit.train.loop import StepResult, TrainConfig

__all__ = [
    "DIGITS_RECIPES",
    "Digits",
    "classify_step",
    "evaluate_classifier",
    "load_digits",
    "random_affine",
    "random_shift",
]


# Training settings per model preset (attnkit.models.vit.PRESETS) for the digits; the
# CLI's defaults. Batch 32 gives twice the steps of 64 per epoch, which the
# transformers need on 1,437 images.
DIGITS_RECIPES: dict[str, TrainConfig] = {
    "vit": TrainConfig(epochs=100, batch_size=32, lr=2e-3),
    "vit-mean": TrainConfig(epochs=60, batch_size=32, lr=2e-3),
    "t2t": TrainConfig(epochs=40, batch_size=32, lr=2e-3),
    "cnn": TrainConfig(epochs=30, batch_size=32, lr=3e-3),
}


@dataclass(frozen=True)
class Digits:
    """A fixed split: `train` and `test` hold (images (n, 1, 8, 8), labels (n,)).

    Images are normalised with the *training* pixel mean and std (one scalar
    each), so the background (raw 0) maps to `background`.
    """

    train: TensorDataset
    test: TensorDataset
    mean: float
    std: float

    @property
    def background(self) -> float:
        return -self.mean / self.std

    def to_pixels(self, images: Tensor) -> Tensor:
        """Undo the normalisation: raw intensities in [0, 16], same shape."""
        return images * self.std + self.mean


def load_digits(*, test_fraction: float = 0.2, seed: int = 0) -> Digits:
    """1,797 digits split stratified by class with a fixed seed (1,437 / 360 by default).

    The split depends only on `seed` and `test_fraction`, never on the run.
    """
    datasets = require("sklearn.datasets", "train", "the digits data set")
    train_test_split = require(
        "sklearn.model_selection", "train", "the digits split"
    ).train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    raw = datasets.load_digits()
    images = torch.tensor(raw.images, dtype=torch.float32).unsqueeze(1)  # (1797, 1, 8, 8)
    labels = torch.tensor(raw.target, dtype=torch.long)  # (1797,)
    idx = torch.arange(len(labels)).numpy()
    tr, te = train_test_split(idx, test_size=test_fraction, stratify=raw.target, random_state=seed)
    tr, te = torch.as_tensor(tr), torch.as_tensor(te)
    mean, std = images[tr].mean().item(), images[tr].std().item()
    norm = (images - mean) / std
    return Digits(
        TensorDataset(norm[tr], labels[tr]), TensorDataset(norm[te], labels[te]), mean, std
    )


def random_shift(images: Tensor, max_shift: int = 1, *, fill: float = 0.0) -> Tensor:
    """Translate each image by its own random (dy, dx) in [-max_shift, max_shift]².

    images (B, C, H, W) -> (B, C, H, W); uncovered pixels get `fill` (pass the
    normalised background). Uses the global torch RNG.
    """
    if images.dim() != 4:
        raise ValueError(f"images must have shape (B, C, H, W), got {tuple(images.shape)}")
    if max_shift == 0:
        return images
    b, _, h, w = images.shape
    s = max_shift
    padded = torch.nn.functional.pad(images, (s, s, s, s), value=fill)  # (B, C, H+2s, W+2s)
    off = torch.randint(0, 2 * s + 1, (b, 2), device=images.device)  # top-left of each crop
    rows = off[:, :1] + torch.arange(h, device=images.device)  # (B, H)
    cols = off[:, 1:] + torch.arange(w, device=images.device)  # (B, W)
    batch = torch.arange(b, device=images.device)[:, None, None]  # (B, 1, 1)
    crops = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return crops.permute(0, 3, 1, 2)  # (B, C, H, W)


def classify_step(
    *, augment: Callable[[Tensor], Tensor] | None = None, label_smoothing: float = 0.0
) -> Callable[[nn.Module, tuple[Tensor, Tensor]], StepResult]:
    """A `fit` step for classifiers: batch (images (B, ...), labels (B,)) -> cross-entropy.

    `augment` maps the images (B, ...) to augmented ones (training only).
    """

    def step(model: nn.Module, batch: tuple[Tensor, Tensor]) -> StepResult:
        images, labels = batch
        if augment is not None:
            images = augment(images)
        logits = model(images)  # (B, K)
        loss = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
        correct = int((logits.argmax(-1) == labels).sum())
        return StepResult(loss, len(labels), correct)

    return step


@torch.no_grad()
def evaluate_classifier(
    model: nn.Module, dataset: TensorDataset, *, batch_size: int = 512
) -> dict[str, float]:
    """{"test_loss", "test_acc"} of `model` (switched to eval mode) on (images, labels)."""
    model.eval()
    device = next(model.parameters()).device
    loss, correct, n = 0.0, 0, 0
    for images, labels in DataLoader(dataset, batch_size=batch_size):
        logits = model(images.to(device))  # (B, K)
        labels = labels.to(device)
        loss += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.argmax(-1) == labels).sum())
        n += len(labels)
    return {"test_loss": loss / n, "test_acc": correct / n}


def random_affine(
    images: Tensor,
    *,
    degrees: float = 10.0,
    scale: float = 0.1,
    shift: float = 1.0,
    fill: float = 0.0,
) -> Tensor:
    """Rotate by U(-degrees, degrees), scale by U(1-scale, 1+scale), translate by
    U(-shift, shift) pixels per axis; each image its own draw (global torch RNG).

    images (B, C, H, W) -> (B, C, H, W), bilinear resampling, outside pixels = `fill`.
    """
    if images.dim() != 4:
        raise ValueError(f"images must have shape (B, C, H, W), got {tuple(images.shape)}")
    b, _, h, w = images.shape

    def uniform(bound: float) -> Tensor:
        return (torch.rand(b, device=images.device) * 2 - 1) * bound

    angle = uniform(degrees) * (torch.pi / 180)
    zoom = 1 + uniform(scale)
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    # affine_grid works in [-1, 1] coordinates: a pixel is 2/W wide
    theta = torch.stack(
        [
            torch.stack([cos, -sin, uniform(shift) * 2 / w], -1),
            torch.stack([sin, cos, uniform(shift) * 2 / h], -1),
        ],
        1,
    )  # (B, 2, 3)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)  # (B, H, W, 2)
    out = F.grid_sample(images - fill, grid, align_corners=False)  # zeros outside
    return out + fill
