"""stagewise.weights."""
