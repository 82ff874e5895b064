"""stagewise.models."""
