"""libtide.so through ctypes: loading, the C ABI's general part, errors."""

import ctypes
import os
import re
import subprocess
import sys

import tide
from tide import _lib


def test_loads_with_rtld_local_and_reports_its_version(repo):
    assert tide.version() == "0.1.0"
    text = (repo / "pyproject.toml").read_text()
    assert f'version = "{tide.version()}"' in text


def test_only_the_c_abi_is_exported(build_dir):
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(build_dir / "lib" / "libtide.so")],
        check=True, capture_output=True, text=True,
    ).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert names, "no exported symbols"
    leaked = [n for n in names if not n.startswith("tide_")]
    assert leaked == [], f"symbols other than the C ABI leak out of libtide.so: {leaked[:10]}"


def test_every_function_of_the_c_abi_is_exported(repo, build_dir):
    # Each component's C ABI file is in its component's archive, which libtide.so takes whole: a
    # file left out, or a symbol the link hides, is a function tide.h declares and nobody can call.
    header = (repo / "include" / "tide" / "tide.h").read_text()
    declared = set(re.findall(r"^TIDE_API\b[^(;]*?\b(tide_\w+)\s*\(", header, re.MULTILINE))
    assert len(declared) > 40, "the declarations were not found in tide.h"
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(build_dir / "lib" / "libtide.so")],
        check=True, capture_output=True, text=True,
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert sorted(declared - exported) == [], "declared in tide.h but not exported"
    assert sorted(exported - declared) == [], "exported but not declared in tide.h"


def test_libtide_does_not_link_the_cuda_driver_or_runtime(build_dir):
    out = subprocess.run(
        ["readelf", "-d", str(build_dir / "lib" / "libtide.so")],
        check=True, capture_output=True, text=True,
    ).stdout
    needed = [line for line in out.splitlines() if "(NEEDED)" in line]
    assert needed
    assert not any("libcuda" in line or "libcudart" in line for line in needed), needed


def test_driver_info_through_the_stand_in():
    info = tide.driver_info()
    assert info["device_count"] >= 1
    assert info["driver_version"] >= 12000


def test_device_memory_reports_free_and_total():
    free = ctypes.c_size_t()
    total = ctypes.c_size_t()
    _lib.check(_lib.lib().tide_device_memory(0, ctypes.byref(free), ctypes.byref(total)))
    assert 0 < free.value <= total.value


def test_bad_device_is_an_invalid_argument_with_a_message():
    free = ctypes.c_size_t()
    total = ctypes.c_size_t()
    status = _lib.lib().tide_device_memory(999, ctypes.byref(free), ctypes.byref(total))
    assert status == 1  # TIDE_ERROR_INVALID_ARGUMENT
    assert b"no such device" in _lib.lib().tide_last_error()


def test_missing_driver_is_a_clear_error(repo):
    code = (
        "import tide\n"
        "try:\n"
        "    tide.driver_info()\n"
        "except tide.TideError as e:\n"
        "    print(e.status, e)\n"
    )
    env = dict(os.environ, TIDE_CUDA_DRIVER="/nonexistent/libcuda.so.1",
               PYTHONPATH=str(repo / "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert out.startswith("2 ")  # TIDE_ERROR_NO_DRIVER
    assert "/nonexistent/libcuda.so.1" in out and "TIDE_CUDA_DRIVER" in out


def test_missing_library_names_where_it_looked(repo):
    code = "import tide\ntide.version()\n"
    env = dict(os.environ, TIDE_LIBRARY="/nonexistent/libtide.so",
               PYTHONPATH=str(repo / "python"))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "libtide.so not found" in result.stderr and "/nonexistent/libtide.so" in result.stderr
