"""The package's version: one place, read by the facade, by the hosts' version check and by the
build (``pyproject.toml`` takes it from here)."""

__all__ = ["__version__"]

#: nb_accel's release.
__version__ = "0.2.0"
