"""tide.torch.memory_timeline(): the PNG of memory over the run, phases shaded.

Driven by tide's real telemetry (allocations through libtide's C ABI on the driver tide loads,
phases marked) and by an object with per-step ``stats`` as tide's optimizer keeps them; and by
plot.render() on its own for the edge cases (nothing recorded, unclosed iteration, no stats).
"""

import ctypes
import pathlib
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

import tide.torch as tt  # noqa: E402
from tide.torch import allocator, plot  # noqa: E402

MiB = 1 << 20
PNG = b"\x89PNG\r\n\x1a\n"


class Steps:
    """What memory_timeline() reads from an optimizer: its per-step stats."""

    def __init__(self):
        self.stats = []


def is_png(path: pathlib.Path) -> bool:
    return path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000


def test_plot_of_marked_iterations_with_optimizer_stats(tmp_path):
    lib = allocator._lib_declared()  # tide_alloc and tide_free, typed
    opt = Steps()
    # Iterations are numbered; the record keeps the last 1024, so count by number, not length
    # (the tests before this one may have filled it).
    seen = max((it["index"] for it in tt.iteration_stats()), default=-1)
    for step in range(1, 4):
        tt.mark_phase("forward")
        blocks = [lib.tide_alloc(4 * MiB, 0, None) for _ in range(3)]
        tt.mark_phase("backward")
        for p in blocks[1:]:
            lib.tide_free(p, 4 * MiB, 0, None)
        tt.mark_phase("update")
        t_start = time.monotonic_ns()  # tide's telemetry clock (steady_clock = CLOCK_MONOTONIC)
        lib.tide_free(blocks[0], 4 * MiB, 0, None)
        t_end = time.monotonic_ns()
        tt.mark_phase("end")
        opt.stats.append({"step": step, "gpu_subgroups": step - 1, "cpu_subgroups": 4 - step,
                          "fallback_subgroups": 0, "headroom_bytes": 100 * MiB,
                          "seconds": 1e-3, "predicted_seconds": 1.2e-3,
                          "all_cpu_seconds": 2e-3, "t_start_ns": t_start, "t_end_ns": t_end,
                          "rss_bytes": 300 * MiB})
    iterations = tt.iteration_stats()
    assert [it["index"] for it in iterations if it["index"] > seen] == [seen + 1, seen + 2,
                                                                        seen + 3]
    # The clock claim the optimizer relies on: its update phase sits inside the marked one.
    last = iterations[-1]
    assert last["phases"]["update"]["start_ns"] <= opt.stats[-1]["t_start_ns"]
    assert opt.stats[-1]["t_end_ns"] <= last["end_ns"]

    path = tt.memory_timeline(tmp_path / "sub" / "memory.png", optimizer=opt)
    assert path == tmp_path / "sub" / "memory.png"
    assert is_png(path)
    # Without an optimizer: the device panel only.
    assert is_png(tt.memory_timeline(tmp_path / "device_only.png"))


def test_phase_spans_prefer_the_optimizers_measured_update():
    iterations = [{"index": 0, "start_ns": 100, "end_ns": 400,
                   "phases": {"forward": {"start_ns": 100}, "backward": {"start_ns": 200},
                              "update": {"start_ns": 300}}},
                  {"index": 1, "start_ns": 400, "end_ns": 0,  # still open
                   "phases": {"forward": {"start_ns": 410}}}]
    spans = plot._phase_spans(iterations, [], t_last=500)
    assert spans == [("forward", 100, 200), ("backward", 200, 300), ("update", 300, 400),
                     ("forward", 410, 500)]
    steps = [{"t_start_ns": 310, "t_end_ns": 390}]
    assert plot._phase_spans(iterations, steps, t_last=500)[2:] == [("forward", 410, 500),
                                                                    ("update", 310, 390)]


@pytest.mark.parametrize("samples, iterations, steps", [
    ([], [], []),                                      # nothing recorded yet
    ([(5, 0, 0), (9, 0, 0)], [], [{"step": 1}]),       # no device memory, a stats-less step
    ([(5, MiB, 2 * MiB)], [], [{"step": 1, "rss_bytes": MiB, "t_end_ns": 7}]),
])
def test_render_edge_cases(tmp_path, samples, iterations, steps):
    path = plot.render(tmp_path / "edge.png", samples, iterations, steps, cpu_mode=True)
    assert path.read_bytes()[:8] == PNG
