"""bench/step_overhead.py: its lines (tide against torch's AdamW, per tensor, the update phase
split off) and its refusals of bad arguments."""

import importlib.util
import json

import pytest

from conftest import REPO

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("step_overhead",
                                                  REPO / "bench" / "step_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_line_per_implementation_and_count_with_tides_split(bench, capsys):
    assert bench.main(["--tensors", "3,5", "--rounds", "2", "--micro-batches", "3",
                       "--clip"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(line["bench"] == "step_overhead" and line["cpus"] for line in lines)
    assert {(line["impl"], line["tensors"]) for line in lines} >= {
        ("tide", 3), ("torch_foreach", 3), ("tide", 5), ("torch_foreach", 5)}
    for line in lines:
        assert line["step_seconds"] > 0 and line["rounds"] == 2
        assert line["backward_seconds"] > 0 and line["micro_batches"] == 3 and line["clip"]
        assert line["step_us_per_tensor"] == round(line["step_seconds"] / line["tensors"] * 1e6, 3)
    for tide in (line for line in lines if line["impl"] == "tide"):
        assert 0 < tide["phase_seconds"] and tide["outside_phase_seconds"] < tide["step_seconds"]
        peers = [line for line in lines
                 if line["tensors"] == tide["tensors"] and line["impl"] != "tide"]
        best = min(peers, key=lambda line: line["step_seconds"])
        assert tide["fastest_peer"] == best["impl"]
        assert tide["tide_over_fastest_peer"] == round(tide["step_seconds"] / best["step_seconds"],
                                                       3)
        bare = min(peer["backward_seconds"] for peer in peers)
        assert tide["hooks_us_per_tensor"] == round(
            (tide["backward_seconds"] - bare) / tide["tensors"] * 1e6, 3)


@pytest.mark.parametrize("args, message", [
    (["--tensors", "0"], "counts from 1 to 100000"),
    (["--tensors", "4,x"], "takes integers"),
    (["--rounds", "0"], "1 to 100000"),
    (["--micro-batches", "0"], "1 to 64"),
])
def test_bad_arguments_are_refused_with_the_value(bench, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
