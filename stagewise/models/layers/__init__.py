"""stagewise.models.layers."""
