"""wattpipe."""
