"""Every ctypes mirror of a tide.h struct in python/tide has the C compiler's layout: the same
fields in the same order (read from tide.h), at the same offsets, and the same size (sizeof and
offsetof from a small C program built here with the environment's `cc` against tide.h). A field
added to tide.h and not to its mirror, or reordered, fails here."""

from __future__ import annotations

import ctypes
import importlib
import inspect
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADER = ROOT / "include" / "tide" / "tide.h"
MODULES = ["tide._lib", "tide.kernels", "tide.pinned", "tide.torch._executor",
           "tide.torch.allocator"]

# Each mirror and the C struct it mirrors.
MIRRORS = {
    "tide._lib.KnobValue": "tide_knob_value",
    "tide.kernels.AdamHyper": "tide_adam_hyper",
    "tide.kernels.AdamSubgroup": "tide_adam_subgroup",
    "tide.kernels.CpuOptions": "tide_cpu_options",
    "tide.kernels.AdamResult": "tide_adam_result",
    "tide.kernels.CpuInfo": "tide_cpu_info",
    "tide.kernels.StateFormat": "tide_state_format",
    "tide.pinned.PinnedOptions": "tide_pinned_options",
    "tide.pinned.PinnedStats": "tide_pinned_stats",
    "tide.pinned.NodePinned": "tide_node_pinned",
    "tide.torch._executor.Rates": "tide_rates",
    "tide.torch._executor.HostMemoryRates": "tide_host_memory_rates",
    "tide.torch._executor.ParamSlice": "tide_param_slice",
    "tide.torch._executor.Options": "tide_optimizer_options",
    "tide.torch._executor.SubgroupBuffers": "tide_subgroup_buffers",
    "tide.torch._executor.PlacementPolicy": "tide_placement_policy",
    "tide.torch._executor.StepRequest": "tide_step_request",
    "tide.torch._executor.StepResult": "tide_step_result",
    "tide.torch._executor.PlanSummary": "tide_plan_summary",
    "tide.torch.allocator.Stat": "tide_alloc_stat",
    "tide.torch.allocator.Stats": "tide_alloc_stats",
    "tide.torch.allocator.Sample": "tide_alloc_sample",
    "tide.torch.allocator.Iteration": "tide_alloc_iteration",
    "tide.torch.allocator.Forecast": "tide_alloc_forecast",
    "tide.torch.allocator.Oom": "tide_alloc_oom",
}


def mirrors() -> dict[str, type]:
    """Every ctypes.Structure class defined in tide's Python modules, by qualified name."""
    found = {}
    for name in MODULES:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (issubclass(cls, ctypes.Structure) and cls.__module__ == name
                    and "_fields_" in cls.__dict__):
                found[f"{name}.{cls.__name__}"] = cls
    return found


def header_fields() -> dict[str, list[str]]:
    """Each `typedef struct NAME { ... } NAME;` of tide.h: its field names in order."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    out = {}
    for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", text, flags=re.S):
        fields = []
        for declaration in body.split(";"):
            declaration = declaration.strip()
            if declaration:
                fields.append(re.search(r"(\w+)\s*(\[[^\]]*\])?$", declaration).group(1))
        out[name] = fields
    return out


@pytest.fixture(scope="module")
def compiled_layout(tmp_path_factory) -> dict[str, int]:
    """sizeof(S) as "S" and offsetof(S, f) as "S.f", from the C compiler."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) in this environment")
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "tide/tide.h"',
             "int main(void) {"]
    for c_name in sorted(set(MIRRORS.values())):
        lines.append(f'  printf("{c_name} %zu\\n", sizeof({c_name}));')
        for field in header_fields()[c_name]:
            lines.append(f'  printf("{c_name}.{field} %zu\\n", offsetof({c_name}, {field}));')
    lines += ["  return 0;", "}"]
    folder = tmp_path_factory.mktemp("layout")
    source = folder / "layout.c"
    source.write_text("\n".join(lines) + "\n")
    program = folder / "layout"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-I", str(ROOT / "include"),
                    str(source), "-o", str(program)], check=True)
    output = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout
    return {key: int(value) for key, value in (line.split() for line in output.splitlines())}


def test_every_structure_in_python_tide_is_a_known_mirror():
    assert sorted(mirrors()) == sorted(MIRRORS)


@pytest.mark.parametrize("mirror", sorted(MIRRORS))
def test_mirror_has_the_c_layout(mirror, compiled_layout):
    cls = mirrors()[mirror]
    c_name = MIRRORS[mirror]
    names = [field[0] for field in cls._fields_]
    assert names == header_fields()[c_name], f"{mirror} does not list {c_name}'s fields in order"
    assert ctypes.sizeof(cls) == compiled_layout[c_name], f"sizeof({c_name})"
    for name in names:
        assert getattr(cls, name).offset == compiled_layout[f"{c_name}.{name}"], \
            f"offsetof({c_name}, {name})"


def test_the_check_sees_a_field_the_mirror_lacks():
    """What the checks above compare: a mirror missing a field of its struct differs."""
    class Short(ctypes.Structure):
        _fields_ = mirrors()["tide.torch._executor.Options"]._fields_[:-1]
    assert [f[0] for f in Short._fields_] != header_fields()["tide_optimizer_options"]
