"""Plots of tide's memory telemetry: ``memory_timeline()`` draws it as a PNG.

It reads only what tide has recorded already, so it can be called at any point of a run (usually
at its end):

- the device timeline, ``timeline()``: (t_ns, live, reserved) samples of tide's allocator;
- the iterations, ``iteration_stats()``: where each iteration and each phase (forward, backward,
  update) began, from marks or detected from the memory curve;
- when an optimizer is given, its per-step stats (``optimizer.stats``): the measured update phase
  (``t_start_ns``, ``t_end_ns``), the plan (subgroups on the GPU and on the CPU, headroom), the
  measured and predicted update times, and the process's host memory (``rss_bytes``).

All times are on tide's telemetry clock: C++'s ``std::chrono::steady_clock``, which on Linux is
``CLOCK_MONOTONIC``, the clock of Python's ``time.monotonic_ns()``.

The figure is drawn with matplotlib's object API (``Figure`` + the Agg canvas), never pyplot, so it
needs no display and leaves the program's own pyplot backend and figures alone.

(The module is ``plot``, not ``timeline``: importing a submodule ``tide.torch.timeline`` would
replace the package's ``timeline()`` function with the module.)
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from typing import Any

from tide.torch import allocator

_PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "update": "#55a868"}
_CPU_MODE_NOTE = ("CPU mode (host stand-in driver): the model's tensors are CPU tensors, unseen "
                  "by tide's device allocator")
# The update phase is the one tide works on, and often the shortest: shaded darker to stand out.
_PHASE_ALPHA = {"forward": 0.18, "backward": 0.18, "update": 0.4}


def memory_timeline(path: str | os.PathLike = "tide_memory.png", device: Any = None,
                    optimizer: Any = None) -> pathlib.Path:
    """Writes a PNG of memory over the run with the phases shaded, and returns its path.

    Panels: device memory (live and reserved, tide's allocator on `device`; the optimizer's
    update buffers where its stats give "buffer_bytes"); with `optimizer` (a tide optimizer, or
    anything with a ``stats`` list of per-step dicts) also the host memory of the process at
    each step, the plan of each step (subgroups on the GPU / CPU, headroom) and its update phase
    (measured, predicted, all-CPU prediction). In CPU mode, where the device panel would be
    empty, the host memory takes its place.
    """
    samples = allocator.timeline(device)
    iterations = allocator.iteration_stats(device)
    steps = list(getattr(optimizer, "stats", None) or [])
    return render(pathlib.Path(path), samples, iterations, steps, cpu_mode=_cpu_mode())


def _cpu_mode() -> bool:
    """tide.torch.cpu_mode() when the optimizer module provides it; otherwise: no CUDA in torch."""
    import tide.torch

    probe = getattr(tide.torch, "cpu_mode", None)
    if probe is not None:
        return bool(probe())
    import torch

    return not torch.cuda.is_available()


def render(path: pathlib.Path, samples: Sequence[tuple[int, int, int]],
           iterations: Sequence[dict[str, Any]], steps: Sequence[dict[str, Any]], *,
           cpu_mode: bool = False) -> pathlib.Path:
    """Draws already-collected telemetry (the formats of timeline(), iteration_stats() and
    optimizer.stats) to `path`. Separate from memory_timeline() so it can be tested on its own."""
    from matplotlib.figure import Figure  # imported here: matplotlib is slow to import

    times = [s[0] for s in samples] + [it["start_ns"] for it in iterations]
    times += [s[k] for s in steps for k in ("t_start_ns", "t_end_ns") if s.get(k)]
    t0 = min(times, default=0)
    t_last = max(times + [it["end_ns"] for it in iterations], default=0)

    def seconds(t_ns: int) -> float:
        return (t_ns - t0) / 1e9

    has_rss = any(s.get("rss_bytes") for s in steps)
    has_times = any(s.get(k) is not None for s in steps
                    for k in ("seconds", "predicted_seconds", "all_cpu_seconds"))
    # The device panel, unless it would be empty while the host panel tells the story (CPU mode:
    # nothing of the model goes through tide's device allocator).
    has_device = (any(s[1] or s[2] for s in samples) or any(s.get("buffer_bytes") for s in steps)
                  or not has_rss)
    time_panels = has_device + has_rss
    step_panels = bool(steps) + has_times
    fig = Figure(figsize=(11, 3.2 * (time_panels + step_panels) + 0.8), layout="constrained")
    grid = fig.add_gridspec(time_panels + step_panels, 1)
    time_axes = [fig.add_subplot(grid[0])]
    if time_panels == 2:
        time_axes.append(fig.add_subplot(grid[1], sharex=time_axes[0]))

    if has_device:
        _draw_device(time_axes[0], samples, steps, seconds)
    if has_rss:
        _draw_host(time_axes[-1], steps, seconds)
    spans = _phase_spans(iterations, steps, t_last)
    for ax in time_axes:
        _shade(ax, spans, iterations, seconds)
    time_axes[-1].set_xlabel("time since the first sample (s)")
    _label_iterations(time_axes[0], iterations, seconds)

    if steps:
        _draw_plans(fig.add_subplot(grid[time_panels]), steps)
    if has_times:
        _draw_update_times(fig.add_subplot(grid[time_panels + 1]), steps)

    title = "tide memory timeline"
    if cpu_mode:
        title += "\n" + _CPU_MODE_NOTE
        if not has_device:
            title += "\nthe process's host memory shows the run instead"
    fig.suptitle(title, fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def _unit(largest: float) -> tuple[float, str]:
    for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if largest >= scale:
            return float(scale), name
    return 1.0, "B"


def _draw_device(ax, samples, steps, seconds) -> None:
    """Live and reserved bytes of tide's allocator, and the GPU buffers of each update phase where
    the optimizer reports them ("buffer_bytes": part of the live curve when they come from tide's
    allocator, the line shows which part; drawn alone when the driver gave them)."""
    ax.set_title("device memory (tide's allocator)", fontsize=10, loc="left")
    buffers = [(s["t_start_ns"], s["t_end_ns"], s["buffer_bytes"]) for s in steps
               if s.get("buffer_bytes") and s.get("t_start_ns") and s.get("t_end_ns")]
    peak = max([max(s[1], s[2]) for s in samples] + [b for _, _, b in buffers], default=0)
    if peak == 0:
        ax.text(0.5, 0.5, "tide's allocator held no device memory", transform=ax.transAxes,
                ha="center", va="center", color="gray")
    scale, unit = _unit(peak)
    if samples:
        x = [seconds(s[0]) for s in samples]
        # Samples are taken when the memory moves: the curve holds its value until the next one.
        ax.plot(x, [s[2] / scale for s in samples], drawstyle="steps-post", color="black",
                linewidth=1, alpha=0.6, label="reserved")
        ax.plot(x, [s[1] / scale for s in samples], drawstyle="steps-post", color="#c44e52",
                linewidth=1.3, label="live")
    if buffers:
        x, y = [], []
        for start, end, size in buffers:
            x += [seconds(start), seconds(start), seconds(end), seconds(end)]
            y += [0, size / scale, size / scale, 0]
        ax.plot(x, y, color="#937860", linewidth=1.2, label="update buffers (optimizer)")
    ax.set_ylabel(unit)
    ax.set_ylim(0, peak / scale * 1.12 or 1)


def _draw_host(ax, steps, seconds) -> None:
    points = [(s.get("t_end_ns") or s.get("t_start_ns"), s["rss_bytes"])
              for s in steps if s.get("rss_bytes") and (s.get("t_end_ns") or s.get("t_start_ns"))]
    ax.set_title("host memory of the process (resident set, at each step's end)", fontsize=10,
                 loc="left")
    scale, unit = _unit(max(p[1] for p in points)) if points else (1.0, "B")
    ax.plot([seconds(t) for t, _ in points], [b / scale for _, b in points], marker=".",
            color="#8172b3", label="host RSS")
    ax.set_ylabel(unit)  # autoscaled, not from 0: the steps move it little next to its size


def _phase_spans(iterations, steps, t_last: int) -> list[tuple[str, int, int]]:
    """(phase, start_ns, end_ns) for every phase seen. A phase lasts until the next phase of its
    iteration starts, or the iteration ends. When the optimizer recorded its update phases, those
    measured spans replace the iterations' update phases (which would only repeat them)."""
    measured = [("update", s["t_start_ns"], s["t_end_ns"])
                for s in steps if s.get("t_start_ns") and s.get("t_end_ns")]
    spans = []
    for it in iterations:
        end = it["end_ns"] if it["end_ns"] > it["start_ns"] else t_last
        starts = sorted((p["start_ns"], name) for name, p in it["phases"].items())
        ends = [t for t, _ in starts[1:]] + [end]
        for (start, name), stop in zip(starts, ends, strict=True):
            if not (measured and name == "update") and stop > start:
                spans.append((name, start, stop))
    return spans + measured


def _shade(ax, spans, iterations, seconds) -> None:
    from matplotlib.patches import Patch

    for name, start, end in spans:
        ax.axvspan(seconds(start), seconds(end), color=_PHASE_COLORS[name],
                   alpha=_PHASE_ALPHA[name], linewidth=0)
    for it in iterations:
        ax.axvline(seconds(it["start_ns"]), color="gray", linewidth=0.5, linestyle=":")
    handles, _ = ax.get_legend_handles_labels()
    seen = {name for name, _, _ in spans}
    handles += [Patch(color=_PHASE_COLORS[n], alpha=_PHASE_ALPHA[n], label=n)
                for n in _PHASE_COLORS if n in seen]
    if handles:  # outside, right of the panel: the curves and the iteration numbers stay clear
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8)


def _label_iterations(ax, iterations, seconds) -> None:
    """Numbers the iterations along the top of the first time panel, skipping a number that would
    sit closer than 1/40 of the time axis to the previous one, so that the labels stay legible."""
    if not iterations:
        return
    starts = [seconds(it["start_ns"]) for it in iterations]
    gap = (max(starts[-1], seconds(iterations[-1]["end_ns"])) - starts[0]) / 40
    last = None
    for it, x in zip(iterations, starts, strict=True):
        if last is None or x - last >= gap:
            ax.annotate(str(it["index"]), (x, 1), xycoords=("data", "axes fraction"),
                        xytext=(2, -10), textcoords="offset points", fontsize=7, color="gray")
            last = x


def _draw_plans(ax, steps) -> None:
    """Subgroups updated on the GPU / the CPU per step (stacked), the headroom on a second axis."""
    from matplotlib.ticker import MaxNLocator

    x = [s.get("step", i + 1) for i, s in enumerate(steps)]
    gpu = [s.get("gpu_subgroups") or 0 for s in steps]
    cpu = [s.get("cpu_subgroups") or 0 for s in steps]
    fallback = [s.get("fallback_subgroups") or 0 for s in steps]
    ax.set_title("plan of each step: subgroups updated on the GPU and on the CPU, and the headroom",
                 fontsize=10, loc="left")
    ax.bar(x, gpu, color="#55a868", label="GPU subgroups")
    ax.bar(x, cpu, bottom=gpu, color="#4c72b0", label="CPU subgroups")
    if any(fallback):
        ax.plot(x, fallback, "x", color="#c44e52", label="fell back to the CPU")
    ax.set_ylabel("subgroups")
    ax.set_xlabel("step")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    # Room above the bars and the headroom line for the legend.
    ax.set_ylim(0, max(g + c for g, c in zip(gpu, cpu, strict=True)) * 1.4 or 1)
    lines, labels = ax.get_legend_handles_labels()
    headroom = [s.get("headroom_bytes") for s in steps]
    if any(h is not None for h in headroom):
        scale, unit = _unit(max(h or 0 for h in headroom))
        twin = ax.twinx()
        twin.plot(x, [float("nan") if h is None else h / scale for h in headroom], color="black",
                  marker=".", linewidth=1, label="headroom")
        twin.set_ylabel(f"headroom ({unit})")
        twin.set_ylim(0, max(h or 0 for h in headroom) / scale * 1.4 or 1)
        more_lines, more_labels = twin.get_legend_handles_labels()
        lines, labels = lines + more_lines, labels + more_labels
    ax.legend(lines, labels, loc="upper left", fontsize=8, ncols=len(lines))


def _draw_update_times(ax, steps) -> None:
    from matplotlib.ticker import MaxNLocator

    x = [s.get("step", i + 1) for i, s in enumerate(steps)]
    ax.set_title("update phase per step", fontsize=10, loc="left")
    for key, label, style in (("seconds", "measured", "-"),
                              ("predicted_seconds", "predicted (plan)", "--"),
                              ("all_cpu_seconds", "predicted, all on the CPU", ":")):
        values = [s.get(key) for s in steps]
        if any(v is not None for v in values):
            ax.plot(x, [float("nan") if v is None else v * 1e3 for v in values], style,
                    marker=".", label=label)
    ax.set_ylabel("ms")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8)
