"""The one version string of attnkit (read by hatch for the wheel, by attnkit.__version__)."""

__version__ = "0.1.0"
