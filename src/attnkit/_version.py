"""The one version string of attnkit (imports nothing, so `attnkit --version` is instant)."""

__version__ = "0.1.0"
