"""stagewise.runtime."""
