"""stagewise.engine."""
