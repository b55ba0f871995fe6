"""The one version string of attnkit: read by hatch for the wheel and by attnkit.__version__;
imports nothing, so `attnkit --version` is instant."""

__version__ = "0.1.0"
