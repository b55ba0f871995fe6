"""attnkit: self-attention and multi-head self-attention for PyTorch."""

__version__ = "0.1.0"

__all__ = ["__version__"]
