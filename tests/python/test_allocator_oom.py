"""Out of memory under tide's allocator, as PyTorch users expect it: a RuntimeError (PyTorch's
"CUDA out of memory." message, with what tide's allocator was asked for and holds), never a tensor
with a NULL data pointer, and training goes on after it is caught.

PyTorch keeps what a pluggable allocate function returns as the tensor's memory without looking
(CUDAPluggableAllocator::malloc, PyTorch 2.15), so tide hands it tide_alloc_throwing, which throws
instead of returning NULL. The exception's way through a separate library is checked without a
GPU by tests/allocator/device/torch_contract_test.cpp; through PyTorch itself only on a GPU (here,
marked `gpu`). Each case runs in a subprocess: an allocator is installed once per process.
"""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tide.torch import allocator as talloc  # noqa: E402


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **env})


RECORD_FUNCTIONS = """
import ctypes, torch, tide.torch
from tide import _lib
seen = []
real = torch.cuda.memory.CUDAPluggableAllocator
class Recording(real):
    def __init__(self, path, alloc_fn_name, free_fn_name):
        seen.append((path, alloc_fn_name, free_fn_name))
        super().__init__(path, alloc_fn_name, free_fn_name)
torch.cuda.memory.CUDAPluggableAllocator = Recording
tide.torch.use_allocator()
(path, alloc, free), = seen
library = ctypes.CDLL(path)
print(alloc, free, hasattr(library, alloc), hasattr(library, free))
"""


def test_pytorch_gets_the_allocate_function_that_throws():
    result = run(RECORD_FUNCTIONS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["tide_alloc_throwing", "tide_free", "True", "True"]
    assert talloc.ALLOCATE_FUNCTION == "tide_alloc_throwing"


OOM_AND_GO_ON = """
import torch, tide.torch
tide.torch.use_allocator()
MiB = 1 << 20
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).cuda()
opt = tide.torch.AdamW(model.parameters(), lr=1e-3)
def step():
    x = torch.randn(64, 256, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss)
step()
held = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
try:
    torch.empty(1024 * MiB, dtype=torch.uint8, device="cuda")
    print("NO ERROR")
except torch.OutOfMemoryError as e:
    print("TORCH_OOM", str(e).splitlines()[0])
except RuntimeError as e:
    print("RUNTIME_ERROR", str(e).splitlines()[0])
assert tide.torch.last_oom() is not None
assert tide.torch.memory_stats()["num_ooms"] >= 1
del held
losses = [step() for _ in range(3)]
torch.cuda.synchronize()
print("TRAINED", all(l == l for l in losses))
"""


@pytest.mark.gpu
def test_out_of_memory_is_a_runtime_error_and_training_goes_on():
    result = run(OOM_AND_GO_ON, TIDE_ALLOC_MAX_BYTES="256MiB")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("RUNTIME_ERROR CUDA out of memory. tide: out of memory on device 0: "
                               "asked for 1.00 GiB"), lines
    assert "reserved of a limit of 256 MiB (the limit refused it" in lines[0], lines
    assert lines[-1] == "TRAINED True", lines
