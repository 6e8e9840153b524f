"""tide.torch.AdamW under DistributedDataParallel: 2 processes over gloo on the stand-in driver
(CPU mode), fsdp_workers' model and batches (scenario_ddp, scenario_ddp_hook_cases), against
torch.optim.AdamW's for-loop implementation on the same DDP model.

Without tide's DDP hook, DDP averages the gradients after tide's hooks ran (it writes them into
.grad at the end of backward, or all-reduces its buckets in place under gradient_as_bucket_view),
so what a hook copied is never the gradient step() uses: step() copies them again, seen by their
version counters, and once two steps found that, the hooks copy nothing
(gradient_offloads_deferred). With it (register_ddp_offload), each bucket's reduced gradients
are copied in backward once per step, and step() copies only what it cannot trust: gradients
changed after backward, or ones this rank did not compute.
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


@pytest.fixture(scope="module")
def hook_cases(tmp_path_factory):
    results = fsdp_workers.launch("ddp_hook_cases", tmp_path_factory.mktemp("ddp_cases"), WORLD)
    no_errors(results)
    return results


def same_training(results, key):
    """Each rank's tide weights are torch's, and both ranks stepped the same averages."""
    for rank, result in enumerate(results):
        runs = result[key]
        assert rel_diff(runs["tide"]["weights"], runs["torch"]["weights"]) <= FP32_BOUND, rank
    assert rel_diff(results[0][key]["tide"]["weights"],
                    results[1][key]["tide"]["weights"]) == 0.0


def trains_as_torch_with_copies(results, key, expected):
    """same_training, and tide's gradient copies (in backward, deferred, at step) per step are
    `expected(rank, n)`, n the model's parameter tensors."""
    same_training(results, key)
    n = len(results[0][key]["tide"]["weights"])
    for rank, result in enumerate(results):
        counts = result[key]["tide"]["counts"]
        assert counts == expected(rank, n), (rank, counts)


STEPS = fsdp_workers.DDP_STEPS


@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("view", [False, True], ids=["grad_copies", "bucket_views"])
def test_ddp_trains_as_torch_adamw_and_copies_each_gradient_once(trained, view, micro_batches):
    # The first two steps copy in every hook and again at step(), as DDP changed every gradient
    # after them; from the third, only at step().
    trains_as_torch_with_copies(trained, (False, view, micro_batches), lambda rank, n: (
        [(micro_batches * n, 0, n)] * 2 + [(0, micro_batches * n, n)] * (STEPS - 2)))


@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("view", [False, True], ids=["grad_copies", "bucket_views"])
def test_ddp_hook_copies_each_reduced_gradient_in_backward_once(trained, view, micro_batches):
    # Every gradient is copied once a step, in backward, after its bucket's all-reduce; step()
    # finds each as the hook copied it.
    trains_as_torch_with_copies(trained, (True, view, micro_batches),
                                lambda rank, n: [(n, 0, 0)] * STEPS)


@pytest.mark.parametrize("view", [False, True], ids=["grad_copies", "bucket_views"])
def test_ddp_hook_gradients_clipped_after_backward_are_copied_at_step(hook_cases, view):
    # Clipping changes every gradient after the hook copied it: copied again at step(), and from
    # the third step the hook leaves them to step().
    trains_as_torch_with_copies(hook_cases, ("clipped", view),
                                lambda rank, n: [(n, 0, n)] * 2 + [(0, n, n)] * (STEPS - 2))


@pytest.mark.parametrize("view", [False, True], ids=["grad_copies", "bucket_views"])
def test_ddp_hook_with_tides_own_clipping_copies_nothing_at_step(hook_cases, view):
    # opt.clip_grad_norm_ reads the norm from the copies and scales inside the update: the
    # gradients are not written, so the hook's copies hold (torch clips the same model's).
    trains_as_torch_with_copies(hook_cases, ("clipped_by_tide", view),
                                lambda rank, n: [(n, 0, 0)] * STEPS)


@pytest.mark.parametrize("view", [False, True], ids=["grad_copies", "bucket_views"])
def test_ddp_hook_copies_the_result_of_a_hook_of_yours(hook_cases, view):
    trains_as_torch_with_copies(hook_cases, ("new_tensor", view),
                                lambda rank, n: [(n, 0, 0)] * STEPS)


@pytest.mark.parametrize("view", [False, True], ids=["grad_copies", "bucket_views"])
def test_ddp_hook_does_not_trust_copies_of_gradients_a_rank_did_not_compute(hook_cases, view):
    # `extra` (2 tensors) has a gradient of its own on rank 1 only; `unused` (2) on no rank, so
    # no gradient at all. Rank 0 copies `extra`'s again at step(), as DDP may have left it.
    trains_as_torch_with_copies(hook_cases, ("uneven", view),
                                lambda rank, n: [(n, 0, 2 if rank == 0 else 0)] * STEPS)


@pytest.mark.parametrize("view", [False, True], ids=["grad_copies", "bucket_views"])
def test_ddp_hook_with_a_static_graph(hook_cases, view):
    # static_graph: the first backward all-reduces every bucket at its end, in DDP's own final
    # callback; the hook's copies are trusted all the same.
    trains_as_torch_with_copies(hook_cases, ("static_graph", view),
                                lambda rank, n: [(n, 0, 0)] * STEPS)


@pytest.mark.parametrize("view", [False, True], ids=["grad_copies", "bucket_views"])
def test_ddp_hook_with_a_compiled_model(hook_cases, view):
    # torch.compile splits the graph at DDP's buckets; they are still reduced through the hook.
    trains_as_torch_with_copies(hook_cases, ("compiled", view),
                                lambda rank, n: [(n, 0, 0)] * STEPS)


@pytest.mark.parametrize("view", [False, True], ids=["grad_copies", "bucket_views"])
def test_ddp_hook_copies_the_last_of_micro_batches_that_each_all_reduce(hook_cases, view):
    # Three micro-batches a step, none under no_sync(): the hook runs three times a step. Once
    # two steps had three, it copies in the last only.
    trains_as_torch_with_copies(hook_cases, ("synced_micro_batches", view), lambda rank, n: (
        [(3 * n, 0, 0)] * 2 + [(n, 2 * n, 0)] * (STEPS - 2)))


def test_ddp_hook_moves_to_a_new_optimizer_and_outlives_a_dead_one(hook_cases):
    for rank, result in enumerate(hook_cases):
        api = result["api"]
        assert api["first_reduced"] == 0, rank  # the first optimizer's hooks copy again
        n = len(api["weights"])
        assert api["counts"] == [(n, 0)] * STEPS, (rank, api["counts"])
        assert rel_diff(api["weights"], api["torch_weights"]) <= FP32_BOUND, rank
    # With no optimizer left, the hook still all-reduces: both ranks hold the same averages.
    assert rel_diff(hook_cases[0]["api"]["grads_after_optimizer_gone"],
                    hook_cases[1]["api"]["grads_after_optimizer_gone"]) == 0.0


def test_ddp_hook_arguments_are_checked(hook_cases):
    errors = hook_cases[0]["api"]["errors"]
    assert errors["torch_optimizer"].startswith("TypeError: tide: register_ddp_offload takes a "
                                                "tide.torch optimizer, not AdamW"), errors
    assert errors["bad_hook"].startswith("TypeError: tide: hook must be"), errors
    assert "tide's DDP hook already" in errors["another_hook"], errors
    assert "register tide's instead, with yours as its `hook`" in errors["hook_of_yours_first"], (
        errors)


def test_ddp_hook_arguments_before_a_process_group():
    import tide.torch as tt
    model = torch.nn.Linear(2, 2)
    opt = tt.AdamW(model.parameters(), placement="cpu")
    with pytest.raises(TypeError, match="takes a DistributedDataParallel model, not Linear"):
        tt.register_ddp_offload(model, opt)
    with pytest.raises(ValueError, match="`state` is the state of your `hook`"):
        tt.register_ddp_offload(model, opt, state=object())


def test_ddp_hook_averages_as_ddp_does_on_three_ranks(tmp_path):
    # Three ranks: dividing by the world size and multiplying by its inverse round apart.
    results = fsdp_workers.launch("ddp_average", tmp_path, 3)
    no_errors(results)
    for rank, result in enumerate(results):
        for dtype in ("torch.float32", "torch.bfloat16"):
            ddp, tide = result[(False, dtype)], result[(True, dtype)]
            assert all(torch.equal(a, b) for a, b in zip(ddp, tide)), (rank, dtype)


def test_example_under_torchrun(tmp_path):
    """examples/train_gpt_ddp.py as its docstring runs it (torchrun, 2 ranks): every rank copies
    every gradient in backward, none at step(); rank 0's memory timeline."""
    import re

    text = fsdp_workers.run_example("train_gpt_ddp", tmp_path)
    tensors = re.search(r"(\d+) parameter tensors", text)
    for rank in range(WORLD):
        steps = re.findall(rf"^\[rank {rank}\] step (\d)/2 .* gradients copied in backward "
                           r"(\d+), at step (\d+)$", text, re.MULTILINE)
        assert steps == [("1", tensors.group(1), "0"), ("2", tensors.group(1), "0")], text
    png = tmp_path / "tide_memory_rank0.png"
    assert f"memory timeline (rank 0): {png}" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
