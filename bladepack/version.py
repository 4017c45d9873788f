"""The package version. Loader-safe."""

__version__ = "0.1.0"
