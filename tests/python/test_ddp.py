"""tide.torch.AdamW under DistributedDataParallel: 2 processes over gloo on the stand-in driver
(CPU mode), fsdp_workers' model and batches (scenario_ddp), against torch.optim.AdamW's for-loop
implementation on the same DDP model.

DDP averages the gradients after tide's hooks ran (it writes them into .grad at the end of
backward, or all-reduces its buckets in place under gradient_as_bucket_view), so what a hook
copied is never the gradient step() uses: step() copies them again, seen by their version
counters, and once two steps found that, the hooks copy nothing (gradient_offloads_deferred).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or torch.cuda.is_available():
    pytest.skip("CPU mode with gloo (the stand-in driver)", allow_module_level=True)

import fsdp_workers  # noqa: E402
from test_fsdp import FP32_BOUND, WORLD, no_errors, rel_diff  # noqa: E402


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    results = fsdp_workers.launch("ddp", tmp_path_factory.mktemp("ddp"), WORLD)
    no_errors(results)
    return results


@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("view", [False, True], ids=["grad_copies", "bucket_views"])
def test_ddp_trains_as_torch_adamw_and_copies_each_gradient_once(trained, view, micro_batches):
    n = len(trained[0][(view, micro_batches)]["tide"]["weights"])
    for rank, result in enumerate(trained):
        runs = result[(view, micro_batches)]
        assert rel_diff(runs["tide"]["weights"], runs["torch"]["weights"]) <= FP32_BOUND, rank
        hooks = micro_batches * n
        # The first two steps copy in every hook and again at step(), as DDP changed every
        # gradient after them; from the third, only at step().
        assert runs["tide"]["counts"] == [(hooks, 0, n)] * 2 + [(0, hooks, n)] * (
            fsdp_workers.DDP_STEPS - 2), (rank, runs["tide"]["counts"])
    # The ranks stepped the same averaged gradients.
    assert rel_diff(trained[0][(view, micro_batches)]["tide"]["weights"],
                    trained[1][(view, micro_batches)]["tide"]["weights"]) == 0.0
