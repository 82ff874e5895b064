"""stagewise.server."""
