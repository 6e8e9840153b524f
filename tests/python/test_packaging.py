"""Packaging: the source checkout's .venv, the installed layout and the wheel's metadata.

Two ways to get tide into Python: `make` (scripts/bootstrap.sh points .venv at python/, and tide
finds build/lib/libtide.so) and `pip install .` (scikit-build-core builds the library and installs
the package with tide/lib/libtide.so, tide/lib/libtide_standin_cuda.so, tide/bin/tide and the
`tide` console script). The cheap tests check both layouts with the build tree's files; the full
`pip install .` into a fresh virtual environment builds the whole library (minutes) and runs only
with TIDE_TEST_PIP_INSTALL=1 (`make test-pip-install`).
"""

import configparser
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from tide import _lib

REPO = pathlib.Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
PACKAGED = ["tide/lib/libtide.so", "tide/lib/libtide_standin_cuda.so",
            "tide/lib/libtide_preload.so", "tide/bin/tide"]

# What a fresh process prints about the tide it imports.
REPORT = textwrap.dedent("""\
    import json, tide
    from tide import _lib
    print(json.dumps({"package": tide.__file__, "library": _lib.lib()._name,
                      "standin": str(_lib.standin_path()), "version": tide.version()}))
""")


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def plain_env(**extra) -> dict:
    """The environment of a user's shell: nothing that would point Python or tide elsewhere."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "TIDE_LIBRARY", "TIDE_CUDA_DRIVER")}
    env.update(extra)
    return env


def report(python, cwd, env) -> dict:
    out = subprocess.run([str(python), "-c", REPORT], cwd=cwd, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def run_tide_command(argv, env, cwd):
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


# --- the source checkout (make) -----------------------------------------------------------------


@pytest.mark.skipif(not VENV_PYTHON.exists(), reason="no .venv (scripts/bootstrap.sh --python)")
def test_venv_imports_tide_torch_from_any_directory(tmp_path):
    if not (REPO / "build" / "lib" / "libtide.so").is_file():
        pytest.skip("no build/lib/libtide.so (make build)")
    code = REPORT + "import tide.torch\n"
    out = subprocess.run([str(VENV_PYTHON), "-c", code], cwd=tmp_path, env=plain_env(),
                         check=True, capture_output=True, text=True).stdout
    seen = json.loads(out.splitlines()[0])
    assert pathlib.Path(seen["package"]) == REPO / "python" / "tide" / "__init__.py"
    assert pathlib.Path(seen["library"]) == REPO / "build" / "lib" / "libtide.so"
    assert pathlib.Path(seen["standin"]) == REPO / "build" / "lib" / "libtide_standin_cuda.so"


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "tide").exists(),
                    reason="no .venv/bin/tide (scripts/bootstrap.sh --python)")
def test_venv_tide_command_runs_the_build_tree_executable(tmp_path):
    if not (REPO / "build" / "bin" / "tide").is_file():
        pytest.skip("no build/bin/tide (make build)")
    result = run_tide_command([str(REPO / ".venv" / "bin" / "tide"), "version"], plain_env(),
                              tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == pyproject()["project"]["version"]


def test_standin_path_finds_the_build_tree_stand_in(monkeypatch):
    monkeypatch.delenv("TIDE_LIBRARY", raising=False)
    standin = REPO / "build" / "lib" / "libtide_standin_cuda.so"
    if not standin.is_file():
        pytest.skip("no build/lib/libtide_standin_cuda.so (make build)")
    assert _lib.standin_path() == standin


def test_standin_path_looks_next_to_tide_library_first(monkeypatch, tmp_path):
    (tmp_path / "libtide.so").touch()
    (tmp_path / "libtide_standin_cuda.so").touch()
    monkeypatch.setenv("TIDE_LIBRARY", str(tmp_path / "libtide.so"))
    assert _lib.standin_path() == tmp_path / "libtide_standin_cuda.so"
    # None there: the stand-in that ships with the package or the build tree, if any.
    (tmp_path / "libtide_standin_cuda.so").unlink()
    found = _lib.standin_path()
    assert found is None or found.parent.name == "lib" and found.is_file()


# --- the installed layout (pip install .) -------------------------------------------------------


def test_pyproject_declares_the_tide_command():
    project = pyproject()
    assert project["project"]["scripts"] == {"tide": "tide.cli:main"}
    from tide import cli

    assert callable(cli.main)
    packages = project["tool"]["scikit-build"]["wheel"]["packages"]
    assert packages == ["python/tide"]
    assert (REPO / "python" / "tide" / "_startup" / "sitecustomize.py").is_file()


def test_wheel_metadata_lists_the_console_script(tmp_path):
    pytest.importorskip("scikit_build_core")
    code = ("import sys\nfrom scikit_build_core.build import prepare_metadata_for_build_wheel\n"
            "print(prepare_metadata_for_build_wheel(sys.argv[1]))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    dist_info = tmp_path / out.splitlines()[-1].strip()
    entry_points = configparser.ConfigParser()
    entry_points.read(dist_info / "entry_points.txt")
    assert entry_points["console_scripts"]["tide"] == "tide.cli:main"
    metadata = (dist_info / "METADATA").read_text()
    assert f"Version: {pyproject()['project']['version']}\n" in metadata
    assert "Requires-Dist: torch" in metadata


def test_install_rules_give_the_package_its_library_standin_and_command(build_dir, tmp_path):
    """The build tree's install rules (what scikit-build-core puts into the wheel), with the
    Python package beside them: the installed layout, without a second build."""
    cmake = shutil.which("cmake")
    if cmake is None or not (build_dir / "cmake_install.cmake").is_file():
        pytest.skip("no configured build tree")
    site = tmp_path / "site"
    subprocess.run([cmake, "--install", str(build_dir), "--prefix", str(site)], check=True,
                   capture_output=True, text=True)
    for name in PACKAGED:
        assert (site / name).is_file(), f"the install rules leave out {name}"
    assert os.access(site / "tide" / "bin" / "tide", os.X_OK)
    shutil.copytree(REPO / "python" / "tide", site / "tide", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))

    env = plain_env(PYTHONPATH=str(site))
    seen = report(sys.executable, tmp_path, env)
    assert pathlib.Path(seen["package"]) == site / "tide" / "__init__.py"
    assert pathlib.Path(seen["library"]) == site / "tide" / "lib" / "libtide.so"
    standin = site / "tide" / "lib" / "libtide_standin_cuda.so"
    assert pathlib.Path(seen["standin"]) == standin

    # The console script's code path: tide.cli runs the packaged executable.
    command = [sys.executable, "-m", "tide.cli"]
    version = run_tide_command(command + ["version"], env, tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == pyproject()["project"]["version"]
    info = run_tide_command(command + ["info"], dict(env, TIDE_CUDA_DRIVER=str(standin)),
                            tmp_path)
    assert info.returncode == 0, info.stderr
    assert str(standin) in info.stdout


# --- pip install . into a fresh environment (opt-in) --------------------------------------------


@pytest.mark.skipif(os.environ.get("TIDE_TEST_PIP_INSTALL") != "1",
                    reason="a full build: set TIDE_TEST_PIP_INSTALL=1 (make test-pip-install)")
def test_pip_install_into_a_fresh_environment(tmp_path):
    """`pip install SOURCE` (the repository, or TIDE_TEST_PIP_SOURCE, e.g. a clean clone) into a
    new virtual environment. The environment sees this one's packages (torch, numpy, matplotlib,
    through a .pth file) as a PyTorch user's would, so pip resolves tide's dependencies without
    downloading PyTorch; the build itself runs as pip runs it (isolated, scikit-build-core)."""
    source = pathlib.Path(os.environ.get("TIDE_TEST_PIP_SOURCE", REPO))
    venv_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv_dir)], check=True)
    python = venv_dir / "bin" / "python"
    paths = ("import sysconfig; p = sysconfig.get_paths(); "
             "print(p['purelib']); print(p['platlib'])")
    new_site = subprocess.run([str(python), "-c", paths], check=True, capture_output=True,
                              text=True).stdout.split()[0]
    ours = subprocess.run([sys.executable, "-c", paths], check=True, capture_output=True,
                          text=True).stdout.split()
    (pathlib.Path(new_site) / "tide-test-user-packages.pth").write_text(
        "\n".join(dict.fromkeys(ours)) + "\n")

    env = plain_env()
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    start = time.monotonic()
    install = subprocess.run([str(python), "-m", "pip", "install", str(source)], env=env,
                             cwd=tmp_path, capture_output=True, text=True)
    seconds = time.monotonic() - start
    print(f"\npip install {source}: {seconds:.0f} s, exit status {install.returncode}")
    assert install.returncode == 0, install.stdout[-6000:] + install.stderr[-6000:]

    shown = subprocess.run([str(python), "-m", "pip", "show", "-f", "tide"], env=env,
                           check=True, capture_output=True, text=True).stdout
    print(shown)
    files = {line.strip() for line in shown.splitlines() if line.startswith("  ")}
    for name in PACKAGED + ["tide/_startup/sitecustomize.py", "tide/torch/__init__.py"]:
        assert name in files, f"pip installed no {name}"
    assert any(name.endswith("/bin/tide") and name.startswith("..") for name in files)

    package = pathlib.Path(new_site) / "tide"
    seen = report(python, tmp_path, env)
    assert pathlib.Path(seen["package"]) == package / "__init__.py"
    assert pathlib.Path(seen["library"]) == package / "lib" / "libtide.so"
    standin = package / "lib" / "libtide_standin_cuda.so"
    assert pathlib.Path(seen["standin"]) == standin
    subprocess.run([str(python), "-c", "import tide.torch"], cwd=tmp_path, env=env, check=True)

    tide_command = str(venv_dir / "bin" / "tide")
    version = run_tide_command([tide_command, "version"], env, tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == seen["version"]
    info = run_tide_command([tide_command, "info"], dict(env, TIDE_CUDA_DRIVER=str(standin)),
                            tmp_path)
    assert info.returncode == 0, info.stderr
    assert str(standin) in info.stdout
    print(info.stdout)
