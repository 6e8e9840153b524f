"""tide is a guest in PyTorch's process: tide.torch driven by a caller that plays the CUDA runtime's
part on the host stand-in driver (the primary context retained once and current on its thread, a
stream and an event of its own, memory freed once its event says so), as a PyTorch process has it.

After each tide call — optimizers of every placement built, stepped, checkpointed, loaded and
dropped, the cache emptied, arguments refused, a step on another thread — the calling thread has
the context it had, the runtime's own work runs, no driver call was made without a context, and
once tide's objects are gone the primary context holds the references it held before: tide
released what it retained, exactly. (On a GPU the real runtime plays this part: `make gpu-check`
runs tests/python/test_optim.py on CUDA tensors in one process.)
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402

pytestmark = pytest.mark.skipif(
    "libtide_standin_cuda" not in os.environ.get("TIDE_CUDA_DRIVER", ""),
    reason="plays the CUDA runtime on the host stand-in driver (its counters say what tide did)")

PLACEMENTS = ["cpu", "gpu", 2, "auto"]
NOT_READY = 600


class Runtime:
    """The CUDA runtime's part, over the same stand-in library tide loaded."""

    def __init__(self):
        self.cuda = cuda = ctypes.CDLL(os.environ["TIDE_CUDA_DRIVER"])
        for name in ("cuCtxGetCurrent", "cuDevicePrimaryCtxRetain", "cuStreamCreate",
                     "cuEventCreate", "cuEventRecord", "cuEventQuery", "cuMemAlloc_v2",
                     "cuMemFree_v2", "cuMemsetD8Async", "cuCtxSetCurrent"):
            getattr(cuda, name).restype = ctypes.c_int
        self._check(cuda.cuInit(0), "cuInit")
        self.device = ctypes.c_int()
        self._check(cuda.cuDeviceGet(ctypes.byref(self.device), 0), "cuDeviceGet")
        self.context = ctypes.c_void_p()
        self._check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.device),
                    "cuDevicePrimaryCtxRetain")
        self.enter()
        self.stream, self.event = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(cuda.cuStreamCreate(ctypes.byref(self.stream), 1), "cuStreamCreate")
        self._check(cuda.cuEventCreate(ctypes.byref(self.event), 2), "cuEventCreate")

    @staticmethod
    def _check(result, call):
        assert result == 0, f"the runtime's {call} failed: CUresult {result}"

    def enter(self):
        """Serves the calling thread (cudaSetDevice): its context becomes current there."""
        self._check(self.cuda.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def close(self):
        self.enter()
        self._check(self.cuda.cuEventDestroy_v2(self.event), "cuEventDestroy")
        self._check(self.cuda.cuStreamDestroy_v2(self.stream), "cuStreamDestroy")
        self._check(self.cuda.cuDevicePrimaryCtxRelease_v2(self.device),
                    "cuDevicePrimaryCtxRelease")

    def current(self):
        current = ctypes.c_void_p()
        self._check(self.cuda.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        return current.value

    def stat(self, name):
        value = ctypes.c_uint64()
        assert self.cuda.tide_standin_stat(name.encode(), ctypes.byref(value)) == 0, name
        return value.value

    def assert_usable(self, what, expected="runtime"):
        """On this thread, after `what`: the current context is the runtime's (or none when
        expected is None), and the runtime's stream, event and memory work."""
        want = self.context.value if expected == "runtime" else None
        assert self.current() == want, f"{what} changed the thread's current context"
        if want is None:
            return
        cuda, p = self.cuda, ctypes.c_uint64()
        self._check(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 16)), "cuMemAlloc")
        self._check(cuda.cuMemsetD8Async(p, ctypes.c_ubyte(0x5a), ctypes.c_size_t(1 << 16),
                                         self.stream), "cuMemsetD8Async")
        self._check(cuda.cuEventRecord(self.event, self.stream), "cuEventRecord")
        while (r := cuda.cuEventQuery(self.event)) == NOT_READY:
            pass
        self._check(r, "cuEventQuery")
        self._check(cuda.cuMemFree_v2(p), "cuMemFree")


@pytest.fixture
def runtime():
    # From its first optimizer on tide holds one reference to the device's primary context for
    # the process's life (its pooled streams, which PyTorch's record_stream may name, live as
    # long), and its allocator of the device lives as long: both taken now, before the baseline.
    tt.headroom(0)
    net = model()
    tt.AdamW(net.parameters())
    gc.collect()
    rt = Runtime()
    counters = ("primary_ctx_references", "unretained_releases", "calls_without_context",
                "destroyed_stream_uses")
    before = {k: rt.stat(k) for k in counters}
    yield rt
    gc.collect()
    after = {k: rt.stat(k) for k in counters}
    assert after["unretained_releases"] == before["unretained_releases"]
    assert after["calls_without_context"] == before["calls_without_context"], \
        "tide called the driver without a current context"
    assert after["destroyed_stream_uses"] == before["destroyed_stream_uses"], \
        "a stream was used after its end (an optimizer's, by the next one or the allocator)"
    assert after["primary_ctx_references"] == before["primary_ctx_references"], \
        "tide's objects are gone, but not the references it took (or it took the runtime's)"
    rt.close()


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))


def backward(net):
    net(torch.randn(16, 64)).square().mean().backward()


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_every_call_of_an_optimizers_life_leaves_the_runtime_alone(runtime, placement):
    net = model()
    opt = tt.AdamW(net.parameters(), lr=1e-3, placement=placement, subgroup_size=4096)
    runtime.assert_usable("construction")
    for _ in range(2):
        backward(net)
        runtime.assert_usable("backward's gradient offload")
        opt.step()
        runtime.assert_usable("step")
        assert opt.last_plan["gpu_subgroups"] + opt.last_plan["cpu_subgroups"] > 0
        opt.zero_grad(set_to_none=True)
    state = opt.state_dict()
    runtime.assert_usable("state_dict")
    opt.load_state_dict(state)
    runtime.assert_usable("load_state_dict")
    del opt
    gc.collect()
    runtime.assert_usable("the optimizer's end")
    tt.empty_cache()
    runtime.assert_usable("empty_cache")
    # Another optimizer after one has lived and died: what broke PyTorch on the first real GPU.
    opt = tt.AdamW(net.parameters(), lr=1e-3, placement=placement, subgroup_size=4096)
    backward(net)
    opt.step()
    runtime.assert_usable("the next optimizer's step")
    del opt


def test_refused_arguments_leave_the_runtime_alone(runtime):
    net = model()
    for bad in ({"placement": "sometimes"}, {"subgroup_size": 0}, {"lr": -1.0}):
        with pytest.raises(ValueError):
            tt.AdamW(net.parameters(), **bad)
        runtime.assert_usable(f"a refused {bad}")


def test_a_step_on_a_thread_without_a_context_leaves_it_without_one(runtime):
    net = model()
    opt = tt.AdamW(net.parameters(), lr=1e-3, placement=2, subgroup_size=4096)
    errors = []

    def other_thread():
        try:
            runtime.assert_usable("nothing yet", expected=None)
            backward(net)
            opt.step()
            runtime.assert_usable("a step on a thread the runtime never served", expected=None)
            opt.zero_grad(set_to_none=True)
            del_opt = opt.state_dict()
            runtime.assert_usable("state_dict there", expected=None)
            del del_opt
        except BaseException as e:  # noqa: BLE001 - reported on the test's thread
            errors.append(e)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert not errors, errors[0]
    runtime.assert_usable("the other thread's step")
    backward(net)
    opt.step()
    runtime.assert_usable("a step back on the runtime's thread")
