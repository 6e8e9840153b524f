"""One optimizer step over several buckets, as one step: it happens exactly or not at all.

First every bucket does what it needs before anything can change (the frozen parameters, the
hyperparameters checked, the offloaded gradients in pinned memory: tide_optimizer_ready); a
failure there raises and nothing changed. Then each bucket's update phase runs, and from there a
fault is rolled forward (executor.h): the step completes with the same bits, said in a
RuntimeWarning, and only what cannot be completed is reported as an error after all buckets ran.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

from tide import kernels
from tide.torch import _executor
from tide.torch._bucket import Bucket


class StepIncompleteError(RuntimeError):
    """step() could update only part of the optimizer state: gradients kept on the GPU
    (gradients_on_gpu=True) were lost with the device. The only outcome of a step that is
    neither the whole step nor none of it; restore a checkpoint."""


@dataclasses.dataclass
class BucketStep:
    bucket: Bucket
    frozen: list[int]  # the bucket's parameters without a gradient: left exactly as they are
    hyper: kernels.AdamHyper
    headroom: int  # bytes of GPU memory the update phase may use on the bucket's device


def run(steps: list[BucketStep], policy: _executor.PlacementPolicy | None,
        committed: Callable[[BucketStep], None], flags: int = 0
        ) -> tuple[list[dict[str, Any]], list[Exception]]:
    """The step of every bucket in `steps`. `committed(s)` is called as soon as bucket s's state
    holds the step. `flags` (_executor.STEP_*, one bucket only): what its step call does around
    the update phase. Returns, per bucket, its result, where each subgroup ran, the headroom and
    the GPU bytes its plan used; and the errors to raise once every bucket ran."""
    if len(steps) > 1:
        # Every bucket ready before any changes, so that they fail or succeed together; one
        # bucket's step call does it itself.
        for s in steps:
            s.bucket.set_frozen(s.frozen)
            s.bucket.executor.ready(s.hyper)
        frozen = [None] * len(steps)
    else:
        frozen = [s.bucket.frozen_flags(s.frozen) for s in steps]
    # From here the step completes (one bucket: once its call returns).
    problems: list[Exception] = []
    return [_step_bucket(s, policy, committed, problems, flags, f)
            for s, f in zip(steps, frozen)], problems


def _step_bucket(s: BucketStep, policy: _executor.PlacementPolicy | None,
                 committed: Callable[[BucketStep], None], problems: list[Exception], flags: int,
                 frozen: list[bool] | None) -> dict[str, Any]:
    bucket = s.bucket
    try:
        result = bucket.executor.step(s.hyper, policy, s.headroom, flags=flags, frozen=frozen)
    except Exception:
        bucket.state_moved()  # not happened: where the state is, asked again when needed
        raise
    bucket.state_moved(result.buffer_list)  # its state may be in other buffers now (executor.h)
    # Resident subgroups: the pinned buffers are a mirror now, made current when read.
    bucket.mirror_stale = result.resident_subgroups > 0
    # The step counts advance with the committed state, and only then.
    bucket.step += 1
    committed(s)
    known = len(problems)
    message = result.reason_text
    if result.unwritten:
        # Once more, by tide itself from the committed master weights: the one writer of the
        # model's parameters (the device failed twice in the step already; it may be back).
        try:
            bucket.executor.write_params()
        except Exception as error:  # noqa: BLE001 (a failed GPU: said below)
            problems.append(RuntimeError(
                "tide: the optimizer step completed (the optimizer state holds it: "
                "state_dict() can be saved), but the model's parameters could not be "
                f"written: tide_optimizer_step: {message}; and once more: {error}"))
    if result.outcome == _executor.INCOMPLETE:
        problems.append(StepIncompleteError(
            f"tide: {result.not_updated} of {len(bucket.sizes)} subgroups could not be "
            f"updated (tide_optimizer_step: {message}): the optimizer state is inconsistent; "
            "restore the last checkpoint"))
    if message and len(problems) == known:
        # Completed exactly, after a fault it handled.
        warnings.warn(f"tide: tide_optimizer_step: {message}", RuntimeWarning, stacklevel=4)
    for i in range(len(bucket.params)):
        bucket.versions[i] = bucket.version(i)
    return {"report": result, "devices": result.device_list, "headroom": result.headroom_bytes,
            "gpu_bytes": result.gpu_bytes, "device": str(bucket.device)}
