"""Other libraries meet attnkit here: `attnkit.integrations.transformers` (import it by name)."""
