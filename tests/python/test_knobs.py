"""Every TIDE_* environment variable is registered (config/knobs.cpp) and documented (README)."""

import re
import subprocess

SOURCE_DIRS = ["config", "driver", "allocator", "kernels", "scheduler", "interpose", "standin",
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


def test_every_registered_knob_is_documented_in_the_readme(repo, build_dir):
    readme = (repo / "README.md").read_text()
    undocumented = {k for k in registered(build_dir) if f"`{k}`" not in readme}
    assert not undocumented, f"TIDE_* variables missing from README.md: {sorted(undocumented)}"


def test_tide_env_lists_what_each_knob_accepts(build_dir):
    out = subprocess.run([str(build_dir / "bin" / "tide"), "env"], check=True,
                         capture_output=True, text=True).stdout
    assert "TIDE_CUDA_DRIVER=" in out and "accepts:" in out
