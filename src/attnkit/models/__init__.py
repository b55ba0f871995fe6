"""Models built from attnkit modules."""
