"""Mirrors `torch.nn.attention`: ``attnkit.nn.attention.flex_attention`` is the drop-in for
``torch.nn.attention.flex_attention`` (change the import, keep the code)."""

from attnkit.nn.attention import flex_attention

__all__ = ["flex_attention"]
