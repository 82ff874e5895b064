"""stagewise.cli."""
