"""The orders app's management commands."""
