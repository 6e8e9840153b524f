"""Every TIDE_* environment variable is registered (config/knobs.cpp) and documented (the generated
reference page docs/reference/knobs.md, which tests/python/test_docs.py keeps in step);
knobs the Python tests can reach are checked strictly."""

import os
import re
import subprocess
import sys

import pytest

SOURCE_DIRS = ["config", "driver", "allocator", "kernels", "planner", "runtime", "interpose", "standin",
               "tools", "capi", "python", "scripts", "examples", "bench"]
# A knob is read by name: a quoted "TIDE_..." in C++/Python, ${TIDE_...} in shell.
KNOB_USE = re.compile(r"""["']?(TIDE_[A-Z0-9_]+)["'}]""")
NOT_KNOBS = {"TIDE_VERSION_STRING"}


def registered(build_dir):
    out = subprocess.run([str(build_dir / "bin" / "tide"), "env"], check=True,
                         capture_output=True, text=True).stdout
    return {line.split("=")[0] for line in out.splitlines() if line.startswith("TIDE_")}


def used(repo):
    names = set()
    for folder in SOURCE_DIRS:
        for path in (repo / folder).rglob("*"):
            if path.suffix in {".h", ".cpp", ".cu", ".py", ".sh"} and path.is_file():
                for match in KNOB_USE.finditer(path.read_text(errors="replace")):
                    names.add(match.group(1))
    return names - NOT_KNOBS


def test_every_knob_used_in_the_sources_is_registered(repo, build_dir):
    missing = used(repo) - registered(build_dir)
    assert not missing, f"TIDE_* variables read but not in config/knobs.cpp: {sorted(missing)}"


def test_every_registered_knob_is_documented(repo, build_dir):
    page = (repo / "docs" / "reference" / "knobs.md").read_text()
    undocumented = {k for k in registered(build_dir) if f"`{k}`" not in page}
    assert not undocumented, (f"TIDE_* variables missing from docs/reference/knobs.md: "
                              f"{sorted(undocumented)}; run scripts/gen_docs.py knobs")


def test_tide_env_lists_what_each_knob_accepts(build_dir):
    out = subprocess.run([str(build_dir / "bin" / "tide"), "env"], check=True,
                         capture_output=True, text=True).stdout
    assert "TIDE_CUDA_DRIVER=" in out and "accepts:" in out


@pytest.mark.parametrize("value", ["avx3", "AVX2", "avx512bf16", "avx512", "avx2", "scalar"])
def test_tide_cpu_isa_is_checked(value):
    """A value TIDE_CPU_ISA does not accept, or a variant this CPU cannot run, is an error naming
    the knob; one it runs is what the kernels use. In a fresh process: the knob is read once."""
    from tide import kernels

    supported = kernels.cpu_info()["supported"]
    code = ("from tide import kernels\nimport torch\nprint(kernels.cpu_info()['isa'])\n"
            "p = torch.zeros(8)\n"
            "kernels.cpu_adam_step(p, torch.ones(8), torch.zeros(8), torch.zeros(8), step=1)\n"
            "print(round(float(p[0]), 6))")
    env = dict(os.environ, TIDE_CPU_ISA=value)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=120)
    if value in supported:
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [value, "-0.001"], result.stdout
    else:
        assert result.returncode != 0
        assert "TideError" in result.stderr and f'TIDE_CPU_ISA="{value}"' in result.stderr
        expected = (f"this CPU cannot run the {value} kernels" if value.startswith("avx512")
                    else "accepts one of: auto avx512bf16 avx512 avx2 scalar")
        assert expected in result.stderr, result.stderr


@pytest.mark.parametrize("value", ["0", "100", "257", "4K", "4m", "2G", "-256", "256x"])
def test_tide_gpu_chunk_is_checked(monkeypatch, value):
    """TIDE_GPU_CHUNK takes a multiple of 256 (one 8-bit quantization block) up to 1G, with an
    optional K/M/G suffix; anything else is an error naming the knob when an optimizer is made."""
    import torch

    import tide.torch as tt

    monkeypatch.setenv("TIDE_GPU_CHUNK", value)
    # On the device tide steps: on a GPU it refuses CPU parameters before it reads the knob.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    params = [torch.nn.Parameter(torch.zeros(8, device=device))]
    if value in {"4K", "4m"}:
        tt.AdamW(params, lr=1e-3)
    else:
        with pytest.raises(Exception, match="TIDE_GPU_CHUNK"):
            tt.AdamW(params, lr=1e-3)
