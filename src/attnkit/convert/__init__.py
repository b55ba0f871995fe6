"""Weights in and out of the implementations people already have.

Each peer has one module here with its parameter-name table; the `from_*` and
`to_*` methods of attnkit modules call these functions.
"""

from attnkit.convert.torch_nn import mha_from_torch, mha_to_torch

__all__ = ["mha_from_torch", "mha_to_torch"]
