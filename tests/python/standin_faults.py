"""What the fault tests share: the stand-in driver's fault injection (ctypes), their model, and
bit-for-bit snapshots of everything a step may change (tests/python/test_step_faults.py,
test_soak.py)."""

from __future__ import annotations

import ctypes
import os

import torch


class Net(torch.nn.Module):
    """624 parameters in four subgroups of 160; `extra` has a gradient only at odd steps."""

    def __init__(self, dtype):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.nn.Parameter((torch.randn(16, 24, generator=g) * 0.3).to(dtype))
        self.b1 = torch.nn.Parameter((torch.randn(24, generator=g) * 0.1).to(dtype))
        self.extra = torch.nn.Parameter((torch.randn(24, generator=g) * 0.1).to(dtype))
        self.w2 = torch.nn.Parameter((torch.randn(24, 8, generator=g) * 0.3).to(dtype))

    def loss(self, step):
        g = torch.Generator().manual_seed(100 + step)
        x = torch.randn(32, 16, generator=g).to(self.w1.dtype)
        y = torch.randn(32, 8, generator=g).to(self.w1.dtype)
        h = x @ self.w1 + self.b1
        if step % 2 == 1:
            h = h + self.extra
        return ((torch.tanh(h) @ self.w2 - y).float() ** 2).mean()


class Standin:
    """The stand-in driver's control API (the library tide loaded)."""

    def __init__(self):
        self.lib = ctypes.CDLL(os.environ["TIDE_CUDA_DRIVER"])
        for name in ("tide_standin_fail_copy", "tide_standin_fail_alloc",
                     "tide_standin_fail_launch", "tide_standin_fail_pin",
                     "tide_standin_device_lost"):
            getattr(self.lib, name).argtypes = [ctypes.c_uint64]
        self.lib.tide_standin_stat.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]

    def stat(self, name):
        value = ctypes.c_uint64()
        assert self.lib.tide_standin_stat(name.encode(), ctypes.byref(value)) == 0
        return value.value

    def copies(self):
        return self.stat("copies_h2d") + self.stat("copies_d2h") + self.stat("copies_d2d")

    def allocations(self):
        return self.stat("device_allocs") + self.stat("mem_creates")

    def launches(self):
        return self.stat("kernel_launches")

    def pinnings(self):
        return self.stat("host_registers") + self.stat("host_allocs")

    def calls(self):
        return self.stat("driver_calls")

    def arm(self, kind, n):
        assert getattr(self.lib, f"tide_standin_{kind}")(n) == 0

    def disarm(self):
        for kind in ("fail_copy", "fail_alloc", "fail_launch", "fail_pin", "device_lost"):
            self.arm(kind, 0)


def snapshot(model, opt):
    """Everything a step may change: the weights and the whole state dict, copied."""
    weights = [p.detach().clone() for p in model.parameters()]
    state = {index: {key: value.clone() for key, value in entry.items()}
             for index, entry in opt.state_dict()["state"].items()}
    return weights, state


def differences(a, b):
    """What differs between two snapshots, in words (empty when they are bit for bit equal)."""
    (wa, sa), (wb, sb) = a, b
    out = []
    if len(wa) != len(wb):
        out.append(f"{len(wa)} weights against {len(wb)}")
    for i, (x, y) in enumerate(zip(wa, wb)):
        if not torch.equal(x, y):
            out.append(f"weight {i}: {int((x != y).sum())} elements differ")
    if sa.keys() != sb.keys():
        out.append(f"state of parameters {sorted(sa)} against {sorted(sb)}")
    for index in sa.keys() & sb.keys():
        if sa[index].keys() != sb[index].keys():
            out.append(f"state {index}: keys {sorted(sa[index])} against {sorted(sb[index])}")
        for k in sa[index].keys() & sb[index].keys():
            x, y = sa[index][k], sb[index][k]
            if x.shape != y.shape or x.dtype != y.dtype:
                out.append(f"state {index}.{k}: {x.dtype}{list(x.shape)} against "
                           f"{y.dtype}{list(y.shape)}")
            elif not torch.equal(x, y):
                out.append(f"state {index}.{k}: {int((x != y).sum())} elements differ")
    return out


def same(a, b):
    return not differences(a, b)
