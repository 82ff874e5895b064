"""stagewise.placement."""
