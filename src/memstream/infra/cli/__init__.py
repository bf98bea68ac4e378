"""See the module docstrings below this package."""
