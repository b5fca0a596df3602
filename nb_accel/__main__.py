"""``python -m nb_accel config`` and ``python -m nb_accel env``: what a bug report needs.

``config`` prints the effective default configuration and where it came from; ``env`` prints
versions, the devices this machine has (counted without initialising CUDA) and the notebook
front end detected.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import sys

from .config import ConfigError, config_path, load_config
from .runtime.device_types.cuda_facts import cuda_device_count

__all__ = ["main"]

_PACKAGES = ("nb-accel", "torch", "ipykernel", "ipywidgets", "jupyterlab", "notebook", "tqdm")


def _frontend() -> str:
    """The notebook front end this process runs under, judged from its environment."""
    if "COLAB_RELEASE_TAG" in os.environ or "COLAB_GPU" in os.environ:
        return "Google Colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
        return "Kaggle"
    if "VSCODE_PID" in os.environ or "VSCODE_CWD" in os.environ:
        return "VS Code"
    if "JPY_PARENT_PID" in os.environ or "JPY_SESSION_NAME" in os.environ:
        return "Jupyter"
    return "none detected (a terminal or a script)"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def show_config() -> int:
    """Print the effective configuration and its source; 1 when the file is malformed."""
    path = config_path()
    try:
        config = load_config()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    source = f"from {path}" if path.exists() else f"built-in defaults (no file at {path})"
    print(f"nb_accel configuration, {source}:")
    for name, value in config.to_dict().items():
        print(f"  {name}: {value!r}")
    return 0


def show_env() -> int:
    """Print versions, devices and the notebook front end."""
    print(f"Python {platform.python_version()} ({platform.platform()})")
    for package in _PACKAGES:
        print(f"  {package}: {_version(package)}")
    gpus = cuda_device_count()
    print(f"CPU cores: {os.cpu_count()}")
    print(f"CUDA GPUs: {gpus}" + ("" if gpus else " (none visible)"))
    tpu = importlib.util.find_spec("torch_xla") is not None
    print(f"TPU (torch_xla): {'available' if tpu else 'not installed'}")
    print(f"Notebook front end: {_frontend()}")
    print(f"Configuration file: {config_path()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m nb_accel``."""
    parser = argparse.ArgumentParser(prog="python -m nb_accel", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["config", "env"])
    args = parser.parse_args(argv)
    return show_config() if args.command == "config" else show_env()


if __name__ == "__main__":
    sys.exit(main())
