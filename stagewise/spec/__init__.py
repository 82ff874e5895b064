"""stagewise.spec."""
