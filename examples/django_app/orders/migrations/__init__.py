"""The orders app's migrations."""
