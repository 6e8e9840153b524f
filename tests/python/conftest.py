"""Shared set-up for tide's Python tests.

Tests run against the build tree (build/lib/libtide.so, found by tide._lib) and, when the machine
has no CUDA driver, against the host stand-in driver, exactly as `make run` does.
"""

import ctypes.util
import importlib.util
import os
import pathlib
import sys
import types

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("TIDE_BUILD_DIR", REPO / "build"))
STANDIN = BUILD / "lib" / "libtide_standin_cuda.so"

sys.path.insert(0, str(REPO / "python"))


def load_script(path: pathlib.Path) -> types.ModuleType:
    """A script of the repository (a benchmark, a tool under scripts/) loaded as a module by its
    path, under its file's name, so that tests call its functions without running its main."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

# PyTorch on one thread (before it is imported; subprocesses inherit it): its OpenMP threads
# spin while waiting, and on a small machine they fight tide's own CPU threads for the cores (the
# numerics tests took 2.5x as long). Numbers are compared within one setting, never across.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def real_driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


if "TIDE_CUDA_DRIVER" not in os.environ and not real_driver_present():
    os.environ["TIDE_CUDA_DRIVER"] = str(STANDIN)


def pytest_collection_modifyitems(config, items):
    if real_driver_present():
        return
    skip = pytest.mark.skip(reason="needs a real GPU and CUDA driver")
    for item in items:
        # The marker, not the keyword: a parametrized test whose id is "gpu" is not a GPU test.
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def report_directory(tmp_path_factory):
    """`tide run`'s default report directory ($XDG_STATE_HOME/tide/reports) in a temporary
    directory, not the user's home; subprocesses inherit it."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg_state"))
    return pathlib.Path(os.environ["XDG_STATE_HOME"]) / "tide" / "reports"


@pytest.fixture
def repo() -> pathlib.Path:
    return REPO


@pytest.fixture
def build_dir() -> pathlib.Path:
    return BUILD
