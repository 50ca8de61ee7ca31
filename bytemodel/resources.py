"""Where the files that ship beside the code are: the CUDA sources and the dataset catalogue.

In the repository they live at the top level (gpu/, datasets/). The wheel carries them inside the
package (bytemodel/gpu/, bytemodel/datasets/): pyproject.toml maps the two folders there with
setuptools' package-dir. Looking inside the package first and in the folder above it second finds
them however bytemodel runs: installed wheel, editable install, or PYTHONPATH=<checkout>.
"""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _folder(name: str, marker: str) -> Path:
    """The first of bytemodel/<name>, <checkout>/<name> that holds `marker` (a left-over empty
    folder does not count)."""
    for d in (PACKAGE / name, PACKAGE.parent / name):
        if (d / marker).is_file():
            return d
    return PACKAGE / name  # missing: errors then name the installed location


def gpu_dir() -> Path:
    """The CUDA C sources (*.cu, *.cuh), compiled at run time by NVRTC."""
    return _folder("gpu", "common.cuh")


def datasets_dir() -> Path:
    """The dataset catalogue (catalogue.json), its recipe script and the shipped samples."""
    return _folder("datasets", "catalogue.json")
