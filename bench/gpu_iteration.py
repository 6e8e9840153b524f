"""Whole training iterations on one real GPU: what a user of an offloading optimizer waits for
(`make gpu-check`, or `make bench BENCH=gpu_iteration`).

The model is a bf16 decoder-only transformer (pre-norm blocks of causal self-attention and a 4x
MLP, learned positions, the LM head tied to the embedding): by default 8 blocks of d_model 2048,
sequence 1024, batch 8, vocabulary 2048, about 4.1e8 parameters (--blocks, --d-model, --seq,
--batch; --smoke for a tiny one). Every configuration trains it from the same initial weights on
the same batches (arithmetic sequences of tokens: something to learn) with the same AdamW
hyperparameters, and each step is timed whole: forward, backward, optimizer step, zero_grad, with
torch.cuda.synchronize() before the forward, between forward and backward and around the step,
so that each part is timed on its own too (one synchronize more than a training loop has, in
every configuration alike). The configurations:

  - torch_gpu, the no-offload floor: the bf16 model with fp32 master weights, gradients and Adam
    state all on the GPU, torch.optim.AdamW(fused=True) on the masters, the bf16 weights copied
    from them. That is the same arithmetic as every offloading configuration here (bf16 forward
    and backward, an fp32 update), with nothing leaving the GPU: what offloading can at best
    approach. (An fp32 model under autocast would do other arithmetic and hold more memory.)
  - torch_offload, ZeRO-Offload in plain PyTorch: after backward the bf16 gradients are copied
    (non_blocking) into one flat pinned host buffer, cast to fp32 on the CPU, torch's fused CPU
    AdamW updates flat fp32 master weights, and the weights are cast to bf16 into pinned memory
    and copied back (non_blocking). No overlap with backward: the loop a user writes by hand.
  - tide_cpu, tide_gpu, tide_2, tide_auto: tide.torch.AdamW with tide's allocator, at placement
    "cpu", "gpu", 2 (one GPU subgroup in two) and "auto" (tide's plan).
  - capped_*: tide auto and the fixed placements again with tide's allocator capped at a fraction
    of the device's memory (tide.torch.set_per_process_memory_fraction: with tide's allocator
    installed, torch.cuda.set_per_process_memory_fraction has no effect), so that only part of
    the optimizer state could stay on the GPU. --memory-fraction F sets it; by default it is what
    tide_cpu's run needed at its peak plus 8 bytes per parameter (half of the fp32 master weight,
    moments and gradient), over the device's memory.
  - capped_tide_auto_host_gradients: capped tide auto with gradients_on_gpu=False (by default
    tide keeps the copied-in subgroups' gradients on the GPU where its model says it pays): what
    that default costs or saves under the cap.
  - *_residency_off: tide auto (uncapped and capped) with TIDE_RESIDENCY=off, when this build of
    tide has that knob (`tide env` lists it): the cases above then keep optimizer state resident
    on the GPU where it fits, these do not. Without the knob they are reported as not run.

tide's allocator must be installed before CUDA starts, and torch's cases need torch's own, so the
cases run in a few fresh subprocesses (this script with --worker), each group with its
environment; the parent measures the host memory bandwidth (a 1 GiB CPU tensor copy on all
threads, read plus written bytes per second) before them, and the first worker the pinned copy
bandwidth (1 GiB): each way alone, and both ways at once; and the device memory's (a 1 GiB
device-to-device copy, read plus written bytes per second). The groups run most wanted first
(torch's two, tide's placements, tide auto without residency, then the capped ones);
--time-cap SECONDS bounds the whole run: a group still running at the cap is ended, and its
unfinished cases and the groups after it are reported as not run. Each group's lines are printed
when it ends.

JSON lines: one per case (median iteration and update-phase seconds over --steps after --warmup,
or --capped-warmup in the capped cases; every step's loss and parts, warm-up steps marked; the
steps' peak device memory, tide's last plan), then a summary: tide auto's speedup over
torch_offload (target >= 2.5), tide auto over the floor (target <= 1.3 when the state fits, as it
does uncapped), capped tide auto over the best capped fixed placement (target <= 1.03), and the
largest relative difference of any configuration's losses from the floor's (all must agree
within --loss-rtol); and the floor's and all-resident tide auto's update phases over the time
their bytes per parameter take at the device memory's bandwidth (the hardware limit of an update
with the state on the GPU). Each step's record splits its update into tide's update phase
(phase_ms) and what tide.torch does around it (update_ms less phase_ms). Every line carries the
machine (GPU, CPU, torch, date, commit); the bandwidths have a line of their own and are repeated in the summary. Without a GPU it prints one line {"skipped": ...} and exits 0 (--device cpu rehearses
the whole flow on the CPU over tide's host stand-in driver, for tests; its figures mean nothing).
Exit status 1 when a case failed or the losses disagree; missed targets are reported, not failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

BENCH = "gpu_iteration"
SIZES = {
    "default": {"blocks": 8, "d_model": 2048, "seq": 1024, "batch": 8, "vocab": 2048},
    "smoke": {"blocks": 2, "d_model": 128, "seq": 32, "batch": 2, "vocab": 256},
}
HEAD_DIM = 128
HYPER = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
TARGETS = {"tide_auto_speedup_over_torch_offload": (">=", 2.5),
           "tide_auto_over_floor": ("<=", 1.3),
           "capped_auto_over_best_fixed": ("<=", 1.03)}
PLACEMENTS = ("auto", "cpu", "gpu", 2)
FIXED = ("cpu", "gpu", "2")
# Bytes per parameter the default cap leaves for optimizer state on top of tide_cpu's peak.
CAP_STATE_BYTES_PER_PARAM = 8
BANDWIDTH_BYTES = 1 << 30
# Device memory bytes per parameter of an update phase whose state is on the GPU, for its bound
# at the device's memory bandwidth. tide's resident update: the bf16 gradient read, the fp32
# master weights and both moments read and written, the bf16 weights written (28). The floor
# (GpuMasters.step): the bf16 gradients into fp32 ones (2 + 4), torch's fused AdamW (the fp32
# gradient read, masters and moments read and written: 28), the masters into the bf16 weights
# (4 + 2): 40.
UPDATE_BYTES_PER_PARAM = {"tide_auto": 28, "torch_gpu": 40}


# ---- what the cases are ------------------------------------------------------------------------

def tide_case(placement, capped: bool = False, residency: str | None = None,
              host_gradients: bool = False) -> dict:
    name = (f"tide_{placement}" + ("_residency_off" if residency == "off" else "")
            + ("_host_gradients" if host_gradients else ""))
    case = {"case": ("capped_" if capped else "") + name, "impl": "tide",
            "placement": str(placement), "capped": capped, "residency": residency or "default"}
    if host_gradients:
        case["gradients_on_gpu"] = False
    return case


def groups(residency_reason: str | None) -> list[dict]:
    """The subprocesses, in the order they run: each {"name", "allocator", "capped", "env",
    "cases"}. residency_reason: why the TIDE_RESIDENCY cases cannot run (None: they can)."""
    def residency_off(capped: bool) -> dict:
        return {"name": "tide_residency_off" + ("_capped" if capped else ""), "allocator": "tide",
                "capped": capped, "env": {"TIDE_RESIDENCY": "off"},
                "cases": [tide_case("auto", capped=capped, residency="off")],
                "not_run": residency_reason}

    # Most wanted first: a time cap cuts from the end. The capped cases (issue 28's open
    # target) before the residency-off ones, which are for reference; they need the tide group
    # first (its tide_cpu peak sizes the cap).
    return [
        {"name": "torch", "allocator": "torch", "capped": False, "env": {},
         "cases": [{"case": "torch_gpu", "impl": "torch", "placement": "gpu (no offload)",
                    "capped": False},
                   {"case": "torch_offload", "impl": "torch", "placement": "cpu (plain offload)",
                    "capped": False}]},
        {"name": "tide", "allocator": "tide", "capped": False, "env": {},
         "cases": [tide_case(p) for p in PLACEMENTS]},
        {"name": "tide_capped", "allocator": "tide", "capped": True, "env": {},
         "cases": [tide_case(p, capped=True) for p in PLACEMENTS]
         + [tide_case("auto", capped=True, host_gradients=True)]},
        residency_off(False),
        residency_off(True),
    ]


def param_count(blocks: int, d_model: int, seq: int, vocab: int) -> int:
    """The model's parameters: per block two LayerNorms (2d each), qkv (3d^2), the attention's
    projection (d^2) and the MLP (8d^2), no biases in the linears; the tied embedding (vocab x d),
    learned positions (seq x d) and the final LayerNorm."""
    d = d_model
    return blocks * (12 * d * d + 4 * d) + vocab * d + seq * d + 2 * d


def check_args(args: argparse.Namespace) -> None:
    """Argument errors as argparse reports them (ValueError with the message)."""
    for name in ("blocks", "d_model", "seq", "batch", "vocab", "steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    for name in ("warmup", "capped_warmup"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be 0 or more, "
                             f"not {getattr(args, name)}")
    if args.d_model % HEAD_DIM and args.d_model % 64:
        raise ValueError(f"--d-model must be a multiple of 64 (heads of {HEAD_DIM} or 64), "
                         f"not {args.d_model}")
    if args.memory_fraction is not None and not 0 < args.memory_fraction <= 1:
        raise ValueError(f"--memory-fraction must be in (0, 1], not {args.memory_fraction}")
    if args.time_cap is not None and args.time_cap <= 0:
        raise ValueError(f"--time-cap must be positive, not {args.time_cap}")
    if args.loss_rtol <= 0:
        raise ValueError(f"--loss-rtol must be positive, not {args.loss_rtol}")
    known = [c["case"] for g in groups(None) for c in g["cases"]]
    unknown = [c for c in args.cases.split(",") if c and c not in known]
    if unknown:
        raise ValueError(f"--cases: no case named {', '.join(unknown)} (the cases: "
                         f"{', '.join(known)})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="a tiny model (the sizes' defaults)")
    for name in ("blocks", "d_model", "seq", "batch", "vocab"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help=f"default {SIZES['default'][name]} ({SIZES['smoke'][name]} with --smoke)")
    p.add_argument("--steps", type=int, default=5, help="timed iterations per case")
    p.add_argument("--warmup", type=int, default=2, help="iterations before the timed ones")
    p.add_argument("--capped-warmup", type=int, default=6,
                   help="iterations before the timed ones in the capped cases, where residency "
                        "meets the cap's pressure in the first steps and backs off")
    p.add_argument("--memory-fraction", type=float, default=None,
                   help="the capped cases' cap, a fraction of the device's memory (default: "
                        "tide_cpu's peak plus 8 bytes per parameter)")
    p.add_argument("--time-cap", type=float, default=None,
                   help="seconds for the whole run; groups that would start later are not run")
    p.add_argument("--loss-rtol", type=float, default=2e-2,
                   help="largest relative difference of a case's losses from the floor's")
    p.add_argument("--cases", default="", help="comma-separated case names to run (default all)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: rehearse the flow on the CPU over tide's stand-in (tests only)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    size = SIZES["smoke" if args.smoke else "default"]
    for name, value in size.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        check_args(args)
    except ValueError as e:
        p.error(str(e))
    return args


# ---- results -----------------------------------------------------------------------------------

def ran(record: dict | None) -> bool:
    return bool(record) and isinstance(record.get("iteration_s"), (int, float))


def loss_agreement(records: list[dict], rtol: float, reference: str = "torch_gpu") -> dict:
    """The largest relative difference, over the steps both ran, of each case's losses from the
    reference case's (the first case with losses when the reference has none)."""
    with_losses = [r for r in records if r.get("losses")]
    if not with_losses:
        return {"loss_reference": None, "max_rel_loss_diff": None, "losses_agree": None}
    ref = next((r for r in with_losses if r["case"] == reference), with_losses[0])
    worst, worst_case = 0.0, None
    for r in with_losses:
        for a, b in zip(r["losses"], ref["losses"]):
            diff = abs(a - b) / max(abs(b), 1e-12) if a == a else float("inf")  # NaN: never agrees
            if diff > worst:
                worst, worst_case = diff, r["case"]
    return {"loss_reference": ref["case"], "max_rel_loss_diff": worst,
            "max_rel_loss_diff_case": worst_case, "loss_rtol": rtol, "losses_agree": worst <= rtol}


def device_memory_bounds(records: list[dict], device_gbps: float | None) -> dict:
    """The update phases with the state on the GPU (the floor's; tide auto's when its plan kept
    every subgroup resident) over the time their bytes per parameter take at the device's memory
    bandwidth (UPDATE_BYTES_PER_PARAM): how far each is from the hardware. None where a case did
    not run, tide auto copied or sent anything to the CPU, or the bandwidth is not known."""
    by = {r["case"]: r for r in records if "case" in r}
    out: dict = {"update_bytes_per_param": dict(UPDATE_BYTES_PER_PARAM)}
    for case, per_param in UPDATE_BYTES_PER_PARAM.items():
        r = by.get(case)
        plan = (r or {}).get("plan")
        all_resident = plan is None or (not plan.get("cpu_subgroups") and
                                        plan.get("resident_subgroups") == plan.get("gpu_subgroups"))
        ratio = None
        if device_gbps and ran(r) and r.get("params") and all_resident:
            bound = per_param * r["params"] / (device_gbps * 1e9)
            ratio = round(r["update_s"] / bound, 3)
        out[f"{case}_update_over_device_memory_bound"] = ratio
    return out


def meets(name: str, value: float | None) -> bool | None:
    if value is None:
        return None
    op, bound = TARGETS[name]
    return value >= bound if op == ">=" else value <= bound


def summarize(records: list[dict], rtol: float) -> dict:
    """The summary line's figures from the case lines (ratios of median iteration seconds)."""
    by = {r["case"]: r for r in records if "case" in r}

    def seconds(case):
        return by[case]["iteration_s"] if ran(by.get(case)) else None

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    out: dict = {"case": "summary"}
    auto, offload, floor = seconds("tide_auto"), seconds("torch_offload"), seconds("torch_gpu")
    out["tide_auto_speedup_over_torch_offload"] = ratio(offload, auto)
    out["tide_auto_over_floor"] = ratio(auto, floor)
    fixed = {f"capped_tide_{p}": seconds(f"capped_tide_{p}") for p in FIXED}
    fixed = {k: v for k, v in fixed.items() if v is not None}
    best = min(fixed, key=fixed.get) if fixed else None
    out["capped_best_fixed"] = best
    out["capped_auto_over_best_fixed"] = ratio(seconds("capped_tide_auto"), fixed.get(best))
    for name in TARGETS:
        out[name + "_target"] = " ".join(map(str, TARGETS[name]))
        out[name + "_met"] = meets(name, out[name])
    # Without residency (when the knob exists), the same ratios for comparison.
    off = seconds("tide_auto_residency_off")
    if off is not None:
        out["tide_auto_residency_off_speedup_over_torch_offload"] = ratio(offload, off)
        out["tide_auto_residency_off_over_floor"] = ratio(off, floor)
    host_gradients = seconds("capped_tide_auto_host_gradients")
    if host_gradients is not None:
        out["capped_auto_host_gradients_over_best_fixed"] = ratio(host_gradients,
                                                                  fixed.get(best))
    capped_off = seconds("capped_tide_auto_residency_off")
    if capped_off is not None:
        out["capped_auto_residency_off_over_best_fixed"] = ratio(capped_off, fixed.get(best))
    out["tide_auto_update_over_floor_update"] = ratio(
        by["tide_auto"]["update_s"] if ran(by.get("tide_auto")) else None,
        by["torch_gpu"]["update_s"] if ran(by.get("torch_gpu")) else None)
    out.update(loss_agreement([r for r in records if ran(r)], rtol))
    out["not_run"] = sorted(r["case"] for r in records if r.get("not_run"))
    out["failed"] = sorted(r["case"] for r in records if r.get("error") and not r.get("oom"))
    return out


# ---- the model and the loop (the worker) -------------------------------------------------------

def make_model(torch, args, device):
    """The transformer, built in fp32 from the seed on `device` (the same weights in every
    process), then cast to bf16."""
    nn, F = torch.nn, torch.nn.functional
    d = args.d_model
    heads = d // HEAD_DIM if d % HEAD_DIM == 0 else d // 64

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.fc = nn.Linear(d, 4 * d, bias=False)
            self.out = nn.Linear(4 * d, d, bias=False)

        def forward(self, h):
            b, s, _ = h.shape
            q, k, v = self.qkv(self.ln1(h)).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + self.proj(a.transpose(1, 2).reshape(b, s, d))
            return h + self.out(F.gelu(self.fc(self.ln2(h)), approximate="tanh"))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, d)
            nn.init.normal_(self.embed.weight, std=0.02)
            self.pos = nn.Parameter(torch.zeros(args.seq, d).normal_(std=0.02))
            self.blocks = nn.ModuleList(Block() for _ in range(args.blocks))
            self.ln = nn.LayerNorm(d)

        def forward(self, x, y):
            h = self.embed(x) + self.pos[: x.shape[1]]
            for block in self.blocks:
                h = block(h)
            logits = self.ln(h) @ self.embed.weight.t()
            return F.cross_entropy(logits.float().view(-1, args.vocab), y.reshape(-1))

    torch.manual_seed(args.seed)
    with torch.device(device):
        model = Decoder()
    return model.to(torch.bfloat16)


def batches(torch, args, n: int) -> list:
    """n (input, target) pairs of arithmetic sequences mod vocab: learnable, the same everywhere."""
    g = torch.Generator().manual_seed(args.seed + 1)
    out = []
    for _ in range(n):
        start = torch.randint(args.vocab, (args.batch, 1), generator=g)
        stride = torch.randint(1, 17, (args.batch, 1), generator=g)
        seq = (start + stride * torch.arange(args.seq + 1)) % args.vocab
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


class GpuMasters:
    """The floor: fp32 master weights, their gradients and AdamW's state on the model's device."""

    def __init__(self, torch, params):
        self.params = list(params)
        self.masters = [p.detach().float() for p in self.params]
        for m in self.masters:
            m.grad = torch.zeros_like(m)
        self.opt = torch.optim.AdamW(self.masters, fused=True, **HYPER)

    def step(self):
        for p, m in zip(self.params, self.masters):
            m.grad.copy_(p.grad)
        self.opt.step()
        for p, m in zip(self.params, self.masters):
            p.data.copy_(m)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


class PlainOffload:
    """ZeRO-Offload by hand: flat pinned bf16 gradients and weights, flat fp32 masters and
    gradients on the CPU, torch's fused CPU AdamW."""

    def __init__(self, torch, params, pin: bool):
        self.torch = torch
        self.params = list(params)
        n = sum(p.numel() for p in self.params)
        self.host_grad = torch.empty(n, dtype=torch.bfloat16, pin_memory=pin)
        self.host_weight = torch.empty(n, dtype=torch.bfloat16, pin_memory=pin)
        self.views, at = [], 0
        for p in self.params:
            self.views.append((at, at + p.numel()))
            self.host_weight[at:at + p.numel()].copy_(p.detach().reshape(-1))
            at += p.numel()
        self.master = torch.nn.Parameter(self.host_weight.float())
        self.master.grad = torch.zeros_like(self.master)
        self.opt = torch.optim.AdamW([self.master], fused=True, **HYPER)

    def step(self):
        torch = self.torch
        for p, (a, b) in zip(self.params, self.views):
            self.host_grad[a:b].copy_(p.grad.reshape(-1), non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()
        self.master.grad.copy_(self.host_grad)
        self.opt.step()
        self.host_weight.copy_(self.master.detach())
        for p, (a, b) in zip(self.params, self.views):
            p.data.copy_(self.host_weight[a:b].view_as(p), non_blocking=True)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


def copy_gbps(torch) -> dict:
    """Pinned host <-> device copy rates, GB/s: gpu_update_phase's measurements (1 GiB, best of
    3): each direction alone (h2d_gbps, d2h_gbps), and both at once on two streams (each
    direction's rate while the other runs, both_h2d_gbps and both_d2h_gbps, and the aggregate,
    both_gbps)."""
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    from gpu_update_phase import concurrent_copy_gbps, copy_gbps as alone  # noqa: PLC0415
    h2d, d2h = alone(torch)
    both_h2d, both_d2h, both = concurrent_copy_gbps(torch)
    torch.cuda.empty_cache()
    return {"h2d_gbps": round(h2d, 2), "d2h_gbps": round(d2h, 2),
            "both_h2d_gbps": round(both_h2d, 2), "both_d2h_gbps": round(both_d2h, 2),
            "both_gbps": round(both, 2)}


def device_memory_gbps(torch, nbytes: int = BANDWIDTH_BYTES) -> float:
    """A device-to-device copy of `nbytes`, best of 5 after one unmeasured: bytes read plus
    written per second, GB/s. The limit of an update phase whose state is on the GPU."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return round(2 * nbytes / best / 1e9, 2)


def host_memory_gbps(torch, nbytes: int = BANDWIDTH_BYTES) -> float:
    """A CPU tensor copy on all of this process's cores, best of 5: bytes read plus written per
    second, GB/s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        src = torch.ones(nbytes // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - start)
        return round(2 * nbytes / best / 1e9, 2)
    finally:
        torch.set_num_threads(threads)


def membw_gbps(smoke: bool) -> dict:
    """tide_membw on every core (bench/membw.cpp): the in-place update pass, which has no
    write-allocate traffic as Adam's buffers have none (the ceiling a CPU update reaches; a copy
    reads the line it writes first, so its figure counts a third of its traffic less), and the
    Adam access pattern's. Empty when the build has no tide_membw."""
    membw = REPO / "build" / "bin" / "tide_membw"
    if not membw.is_file():
        return {}
    argv = [str(membw), "--threads", str(len(os.sched_getaffinity(0)))]
    argv += ["--mib", "16", "--reps", "2"] if smoke else ["--mib", "512", "--reps", "5"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return {"host_memory_membw_error": done.stderr.strip()[-200:]}
    line = json.loads(done.stdout.strip().splitlines()[-1])
    return {"host_memory_update_gbps": line["update_gbps"],
            "host_memory_adam_gbps": line["adam_gbps"]}


def run_case(torch, tt, case: dict, args, device: str) -> dict:
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    record = dict(case)
    model = make_model(torch, args, device)
    record["params"] = sum(p.numel() for p in model.parameters())
    if case["case"] == "torch_gpu":
        opt = GpuMasters(torch, model.parameters())
    elif case["case"] == "torch_offload":
        opt = PlainOffload(torch, model.parameters(), pin=cuda)
    else:
        placement = int(case["placement"]) if case["placement"].isdigit() else case["placement"]
        opt = tt.AdamW(model.parameters(), placement=placement,
                       gradients_on_gpu=case.get("gradients_on_gpu"), **HYPER)
    # Under a cap, residency meets the forward pass's pressure in the first steps and backs off
    # (fewer resident subgroups for at least 8 phases): the timed steps come after that.
    warmup = args.capped_warmup if case.get("capped") else args.warmup
    data = batches(torch, args, warmup + args.steps)
    peak = 0  # the peak of the steps, with everything the model and optimizer hold
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    iters, updates, losses, plan, steps = [], [], [], {}, []
    counters = allocator_counters(torch) if cuda else {}
    last = counters
    for i, (x, y) in enumerate(data):
        x, y = x.to(device), y.to(device)
        sync()
        t0 = time.perf_counter()
        loss = model(x, y)
        sync()
        tf = time.perf_counter()
        loss.backward()
        sync()
        t1 = time.perf_counter()
        opt.step()
        sync()
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        sync()
        t3 = time.perf_counter()
        losses.append(loss.item())
        plan = getattr(opt, "last_plan", None) or {}
        # Where each step's time went (warm-up steps too, marked: a transient shows), what was
        # resident after it, the allocator's retries in it (each released the cache or reclaimed
        # resident state) and where tide offloaded gradients: under a cap, the forward and
        # backward passes' extra time has one of these beside it.
        now = allocator_counters(torch) if cuda else {}
        step = {**({"warmup": True} if i < warmup else {}),
                "forward_backward_ms": round((t1 - t0) * 1e3, 2),
                "forward_ms": round((tf - t0) * 1e3, 2),
                "update_ms": round((t2 - t1) * 1e3, 2),
                "zero_grad_ms": round((t3 - t2) * 1e3, 2),
                **{k: plan[k] for k in STEP_PLAN_KEYS if k in plan}}
        for key in [k for k in step if k.endswith("_seconds")]:  # evictions, busy times
            step[key[:-len("_seconds")] + "_ms"] = round(step.pop(key) * 1e3, 2)
        if isinstance(plan.get("seconds"), (int, float)):
            # tide's update phase alone: update_ms less this is tide.torch's work around it.
            step["phase_ms"] = round(plan["seconds"] * 1e3, 2)
        if cuda:
            step.update(alloc_retries=now["num_alloc_retries"] - last["num_alloc_retries"],
                        driver_allocs=now["num_device_alloc"] - last["num_device_alloc"],
                        driver_frees=now["num_device_free"] - last["num_device_free"],
                        peak_live_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3))
            peak = max(peak, torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            if case["impl"] == "tide" and tt.allocator.is_using_allocator():
                step["held_headroom_gib"] = round(
                    tt.allocator.headroom()["held_headroom_bytes"] / 2**30, 3)
        steps.append(step)
        last = now
        if i >= warmup:
            iters.append(t3 - t0)
            updates.append(t2 - t1)
        if i + 1 == warmup:
            counters = now
    record.update({"iteration_s": round(statistics.median(iters), 5),
                   "update_s": round(statistics.median(updates), 5),
                   "warmup_steps": warmup, "timed_steps": len(iters),
                   "losses": [float(f"{v:.6g}") for v in losses]})
    record["params_per_s"] = round(record["params"] / record["iteration_s"])
    if cuda:
        record["peak_device_gib"] = round(peak / 2**30, 3)
        record["peak_device_bytes"] = peak
    if plan:
        record["plan"] = {k: v for k, v in plan.items()
                          if k in ("gpu_subgroups", "cpu_subgroups") or "resident" in k}
    record["steps"] = steps
    if cuda:  # over the timed steps: driver calls and retries of the allocator under the cap
        after = allocator_counters(torch)
        record["allocator"] = {k: after[k] - counters.get(k, 0) for k in after}
        if case["impl"] == "tide":
            record["telemetry"] = allocator_telemetry(tt)
    if case["impl"] == "tide":
        # The model's rates after the run, refined by its steps: `tide plan` with them (and
        # --held-memory from the telemetry's forecast) replays the plan this case ran.
        record["rates"] = opt.rates
    del model, opt
    return record


# Of tide's last plan, what each step records: its plan (GPU and CPU subgroups, and the phase
# time the model predicted for it: beside phase_ms, the model's error), what was resident after
# it, which gradients went to the host during backward and which only at step(), and the
# pressure its passes put on resident state (subgroups taken back home inside their
# allocations, and the time that took; allocations served only by giving the cache back to the
# driver), and how many GPU subgroups found their gradient on the GPU (kept_gradients).
# And where the update phase's time went: each stream's busy time (the GPU's kernels, the copies
# each way, the CPU's updates), in ms.
STEP_PLAN_KEYS = ("gpu_subgroups", "cpu_subgroups", "resident_subgroups",
                  "predicted_seconds", "gradients_offloaded_in_backward",
                  "gradients_offloaded_at_step", "gradient_offloads_deferred",
                  "evicted_subgroups", "evict_seconds",
                  "cache_releases", "withdrawn_gradients", "kept_gradients", "headroom_bytes",
                  "gpu_busy_seconds", "h2d_busy_seconds", "d2h_busy_seconds", "cpu_busy_seconds")


def allocator_telemetry(tt) -> dict:
    """With tide's allocator: its headroom forecast after the last step (what residency and the
    plan were given), the last iteration's peaks by phase (live and reserved: the gap is what
    the cache holds and fragmentation costs under a cap), and the last out-of-memory, if any."""
    alloc = tt.allocator
    if not alloc.is_using_allocator():
        return {}
    gib = 2**30
    last = (alloc.iteration_stats(max_iterations=64) or [{}])[-1]  # oldest first
    forecast = alloc.headroom()
    return {"forecast_gib": {k: round(v / gib, 3) for k, v in forecast.items()
                             if k.endswith("_bytes")},
            "last_iteration_peak_gib": {
                name: {"live": round(p["peak_live_bytes"] / gib, 3),
                       "reserved": round(p["peak_reserved_bytes"] / gib, 3)}
                for name, p in last.get("phases", {}).items()},
            "last_oom": alloc.last_oom()}


def allocator_counters(torch) -> dict:
    """The allocator's counters (PyTorch's names; tide's when its allocator is installed): its
    driver allocations and frees, retries after freeing its cache or reclaiming resident state,
    and out-of-memory errors."""
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ("num_device_alloc", "num_device_free",
                                              "num_alloc_retries", "num_ooms")}


def worker(args) -> int:
    """Runs one group's cases in this process; prints a JSON line per case (and first, the
    device's and bandwidth's lines when asked)."""
    group = json.loads(args.worker)
    import torch

    cuda = args.device == "cuda"
    tt = None
    if group["allocator"] == "tide" or any(c["impl"] == "tide" for c in group["cases"]):
        import tide.torch as tt  # noqa: F811
        if cuda and group["allocator"] == "tide":
            tt.use_allocator()  # before CUDA starts: the headroom forecast needs it
            if group.get("fraction"):
                tt.set_per_process_memory_fraction(group["fraction"])
    torch.set_num_threads(len(os.sched_getaffinity(0)))

    def say(line: dict) -> None:
        print(json.dumps(line), flush=True)

    if cuda:
        props = torch.cuda.get_device_properties(0)
        say({"case": "device", "gpu": props.name, "gpu_memory_bytes": props.total_memory})
        if group.get("bandwidth"):
            say({"case": "bandwidth", **copy_gbps(torch),
                 "device_memory_gbps": device_memory_gbps(torch)})
    failed = False
    for case in group["cases"]:
        try:
            record = run_case(torch, tt, case, args, args.device)
        except Exception as e:  # noqa: BLE001 - reported; the group's other cases still run
            oom = "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"
            record = {**case, "error": repr(e)[:500], "oom": oom,
                      "traceback": traceback.format_exc()[-2000:]}
            failed = failed or not (oom and case.get("capped"))
        if group.get("fraction"):
            record["memory_fraction"] = round(group["fraction"], 4)
        say(record)
        import gc
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
            (tt.empty_cache if tt and group["allocator"] == "tide" else torch.cuda.empty_cache)()
    return 1 if failed else 0


# ---- the parent --------------------------------------------------------------------------------

def tide_command() -> str | None:
    # The build tree of the library tide.torch loads (TIDE_LIBRARY: <build>/lib/libtide.so), else
    # the repository's.
    library = os.environ.get("TIDE_LIBRARY")
    for candidate in (str(pathlib.Path(library).parent.parent) if library else None,
                      str(REPO / "build")):
        if candidate and os.access(pathlib.Path(candidate) / "bin" / "tide", os.X_OK):
            return str(pathlib.Path(candidate) / "bin" / "tide")
    return shutil.which("tide")


def residency_reason(tide: str | None = None) -> str | None:
    """None when this tide has the TIDE_RESIDENCY knob (`tide env` lists it); else why not."""
    tide = tide or tide_command()
    if not tide:
        return "no `tide` command found to ask for TIDE_RESIDENCY (tide env)"
    try:
        out = subprocess.run([tide, "env"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"`tide env` failed: {e}"
    if any(line.startswith("TIDE_RESIDENCY=") for line in out.splitlines()):
        return None
    return "this build of tide has no TIDE_RESIDENCY knob (tide env does not list it)"


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:  # an offline GPU machine's copy of the tree: the bundle says what it was built from
        return json.loads((REPO / "build" / "gpu-bundle.json").read_text()).get("commit", "unknown")
    except (OSError, ValueError):
        return "unknown"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                        platform.processor())
    except OSError:
        return platform.processor()


def default_fraction(records: list[dict], total_bytes: int | None) -> float | None:
    """tide_cpu's peak plus CAP_STATE_BYTES_PER_PARAM per parameter, over the device's memory."""
    cpu = next((r for r in records if r.get("case") == "tide_cpu" and ran(r)), None)
    if not cpu or not total_bytes or "peak_device_bytes" not in cpu:
        return None
    need = cpu["peak_device_bytes"] + CAP_STATE_BYTES_PER_PARAM * cpu["params"]
    return min(1.0, need / total_bytes)


def run_group(group: dict, args, argv: list[str], timeout: float | None) -> tuple[list[dict], str]:
    env = {**os.environ, **group.get("env", {})}
    if args.device == "cpu":  # torch sees no GPU, so tide runs on CPU tensors over its stand-in
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), *argv, "--worker",
           json.dumps({k: group[k] for k in ("allocator", "cases", "fraction", "bandwidth")
                       if k in group})]
    # In this process's group: a limit that ends the group (make gpu-check's) ends it too.
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = p.communicate(timeout=timeout)
        why = "" if p.returncode == 0 else f"exit {p.returncode}"
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        why = "time cap"
    lines = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass
    if err.strip():
        sys.stderr.write(err)
    return lines, why


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    started = time.monotonic()
    import torch

    machine = {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)),
               "torch": torch.__version__, "python": platform.python_version(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": commit()}

    def emit(line: dict) -> None:
        print(json.dumps({"bench": BENCH, **line, "machine": machine}), flush=True)

    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"bench": BENCH, "skipped": "no GPU (torch.cuda.is_available() is False)"}),
              flush=True)
        return 0
    machine["gpu"] = None if args.device == "cuda" else "none (--device cpu rehearsal)"
    bandwidth = {"host_memory_gbps": host_memory_gbps(
        torch, BANDWIDTH_BYTES if args.device == "cuda" else BANDWIDTH_BYTES >> 4),
        **membw_gbps(smoke=args.device != "cuda")}
    wanted = {c for c in args.cases.split(",") if c}
    records: list[dict] = []
    total_bytes = None
    worker_argv = [a for a in argv]
    failed = False
    shown = [0]  # records printed so far; the bandwidth line goes first, once a group has run

    def flush() -> None:
        if shown[0] == 0 and records:
            emit({"case": "bandwidth", **bandwidth})
        for r in records[shown[0]:]:
            emit({k: v for k, v in r.items() if k != "peak_device_bytes"})
        shown[0] = len(records) or shown[0]

    for group in groups(residency_reason()):
        cases = [c for c in group["cases"] if not wanted or c["case"] in wanted]
        if not cases:
            continue
        group = {**group, "cases": cases, "bandwidth": group["name"] == "torch" or not records}
        reason = group.get("not_run")
        if not reason and group["capped"]:
            if args.device != "cuda":
                reason = "--device cpu: no device memory to cap"
            else:
                group["fraction"] = args.memory_fraction or default_fraction(records, total_bytes)
                if not group["fraction"]:
                    reason = "no tide_cpu peak to size the cap from (give --memory-fraction)"
        left = None if args.time_cap is None else args.time_cap - (time.monotonic() - started)
        if not reason and left is not None and left < 5:
            reason = "time cap"
        if reason:
            records += [{**c, "not_run": reason} for c in cases]
            continue
        lines, why = run_group(group, args, worker_argv, left)
        for line in lines:
            if line.get("case") == "device":
                machine["gpu"] = line["gpu"]
                total_bytes = line["gpu_memory_bytes"]
                machine["gpu_memory_gib"] = round(total_bytes / 2**30, 1)
            elif line.get("case") == "bandwidth":
                bandwidth.update({k: v for k, v in line.items() if k != "case"})
        got = {line["case"]: line for line in lines if line.get("case") not in ("device",
                                                                                "bandwidth")}
        for c in cases:
            if c["case"] in got:
                records.append(got[c["case"]])
            else:
                records.append({**c, "not_run" if why == "time cap" else "error":
                                why or "the worker printed no line for it"})
        failed = failed or (bool(why) and why != "time cap")
        flush()  # each group's lines as soon as it ends: a run cut from outside keeps them
    if not records:
        emit({"case": "bandwidth", **bandwidth})
    flush()
    summary = summarize(records, args.loss_rtol)
    summary.update(bandwidth)
    summary.update(device_memory_bounds(records, bandwidth.get("device_memory_gbps")))
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["size"] = {k: getattr(args, k) for k in ("blocks", "d_model", "seq", "batch", "vocab")}
    summary["params"] = param_count(args.blocks, args.d_model, args.seq, args.vocab)
    summary["steps"], summary["warmup"] = args.steps, args.warmup
    summary["capped_warmup"] = args.capped_warmup
    emit(summary)
    failed = failed or bool(summary["failed"]) or summary["losses_agree"] is False
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
