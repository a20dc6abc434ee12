"""The version of forklift, which the package and its traces report."""

__version__ = "0.1.0"
