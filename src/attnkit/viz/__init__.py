"""Seeing attention: capture (record_attention) and renderers."""

from attnkit.viz.record import AttentionRecord, record_attention

__all__ = ["AttentionRecord", "record_attention"]
