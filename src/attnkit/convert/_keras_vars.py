"""Keras access shared by the Keras converters: keras imported on first use (attnkit never
needs it otherwise), a variable's value as a torch tensor (any backend, via numpy), an exact
write into a variable, and the check that a layer is a built one of the expected class."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor


def _keras() -> Any:
    import keras

    return keras


def _tensor(variable) -> Tensor:
    # convert_to_numpy works for every backend; copy so nothing aliases Keras's storage
    return torch.from_numpy(np.array(_keras().ops.convert_to_numpy(variable)))


def _require(layer, cls_name: str, source: str) -> None:
    keras = _keras()
    cls = getattr(keras.layers, cls_name)
    if not isinstance(layer, cls):
        raise ValueError(f"{source}: expected keras.layers.{cls_name}, got {type(layer).__name__}")
    if not layer.built:
        raise ValueError(
            f"{source}: the Keras layer is not built (no weights yet); call it once or build it"
        )


def _assign(variable, t: Tensor) -> None:
    if tuple(variable.shape) != tuple(t.shape):  # a bug here, not user input
        raise RuntimeError(f"Keras variable {variable.path} is {variable.shape}, got {t.shape}")
    variable.assign(t.detach().cpu().contiguous().numpy())
