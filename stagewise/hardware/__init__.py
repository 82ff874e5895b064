"""stagewise.hardware."""
