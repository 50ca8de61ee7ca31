"""The wheel carries what the code needs at run time: every module, the CUDA sources (top-level
gpu/) and the dataset catalogue with its samples (top-level datasets/), mapped into the package
by pyproject.toml. Built offline from a copy of the source (no build isolation, no network)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _can_build_wheels() -> bool:
    try:
        import wheel  # noqa: F401  (setuptools < 70.1 needs it for bdist_wheel)
        return True
    except ImportError:
        try:
            import setuptools.command.bdist_wheel  # noqa: F401
            return True
        except ImportError:
            return False


@pytest.mark.slow
@pytest.mark.skipif(not _can_build_wheels(), reason="needs the 'wheel' package (the test extra has it)")
def test_wheel_holds_modules_kernels_and_catalogue(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("bytemodel", "gpu", "datasets"):
        shutil.copytree(ROOT / d, src / d, ignore=ignore)
    out = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "--no-index", "-q", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("bytemodel-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())

    want = {"bytemodel/" + p.relative_to(ROOT / "bytemodel").as_posix()
            for p in (ROOT / "bytemodel").rglob("*.py") if "__pycache__" not in p.parts}
    want |= {"bytemodel/gpu/" + p.name for p in (ROOT / "gpu").iterdir() if p.suffix in (".cu", ".cuh")}
    want |= {"bytemodel/datasets/" + n for n in
             ("catalogue.json", "make_catalogue.py", "lambda_virus.fa", "klebsiella_hs11286_1m.fa.gz")}
    assert any(n.endswith(".cu") for n in want) and "bytemodel/cli/__main__.py" in want
    missing = sorted(want - names)
    assert not missing, f"not in the wheel: {missing}"
    # nothing of the repository's other folders rides along
    assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks", "examples", "gpu", "datasets")]


def test_resources_found_from_the_source_tree():
    """With PYTHONPATH=<checkout> (no install) the CUDA sources and the catalogue are found."""
    from bytemodel.resources import datasets_dir, gpu_dir
    assert (gpu_dir() / "rmsnorm.cu").is_file() and (gpu_dir() / "common.cuh").is_file()
    assert (datasets_dir() / "catalogue.json").is_file()
