"""bench/ddp_offload.py: its lines (tide's DDP hook against tide without it and torch's AdamW, on
2 gloo processes) and its refusals of bad arguments."""

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import REPO

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or torch.cuda.is_available():
    pytest.skip("CPU mode with gloo (the stand-in driver)", allow_module_level=True)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("ddp_offload", REPO / "bench" / "ddp_offload.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_line_per_implementation_with_the_copies_step_made():
    # As `make bench` runs it: its ranks are spawned, and import the script by its path.
    run = subprocess.run([sys.executable, str(REPO / "bench" / "ddp_offload.py"), "--world", "2",
                          "--layers", "3", "--width", "16", "--steps", "2"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = {line["impl"]: line for line in map(json.loads, run.stdout.splitlines())}
    assert set(lines) == {"torch", "tide", "tide_hook"}
    for line in lines.values():
        assert line["bench"] == "ddp_offload" and line["cpus"] and line["world"] == 2
        assert line["elements"] == 3 * (16 * 16 + 16) and line["device"] == "cpu"
        assert line["backward_seconds"] > 0 and line["step_seconds"] > 0
    # Without the hook, step() copies every gradient (3 weights, 3 biases); with it, none.
    assert lines["tide"]["gradients_copied_at_step"] == 6
    assert lines["tide_hook"]["gradients_copied_at_step"] == 0
    hook = lines["tide_hook"]
    assert hook["over_tide_without_hook"] == round(
        hook["backward_and_step_seconds"] / lines["tide"]["backward_and_step_seconds"], 3)
    assert hook["step_seconds_saved"] == lines["tide"]["step_seconds"] - hook["step_seconds"]
    assert hook["copy_seconds_at_host_bandwidth"] > 0
    assert hook["weights_max_abs_diff_to_tide"] == 0.0


@pytest.mark.parametrize("argv", [["--world", "0"], ["--layers", "0"], ["--width", "70000"],
                                  ["--steps", "0"], ["--world", "two"]])
def test_bad_arguments_are_refused(bench, argv):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
