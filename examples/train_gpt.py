#!/usr/bin/env python3
"""Trains a small GPT on the generated corpus with tide's allocator and tide's AdamW.

    .venv/bin/python examples/train_gpt.py                 # a short run (what `make run` does)
    .venv/bin/python examples/train_gpt.py --compare       # also torch.optim.AdamW, same seed
    .venv/bin/python examples/train_gpt.py --layers 8 --d-model 512 --steps 200 --placement 2

One line per iteration (loss, forward/backward/update times, the plan's subgroups on the GPU and
the CPU, the headroom), then the memory timeline PNG and the Perfetto trace in --out. Without a
GPU the model and data are CPU tensors and tide runs over its host stand-in driver: tide.torch says
so at start-up, and nothing else changes.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # gpt.py and corpus.py, also when this file is imported
try:
    import tide.torch
except ImportError:  # a source checkout without tide installed: use its python/ folder
    sys.path.insert(0, str(HERE.parent / "python"))
    import tide.torch

import corpus  # noqa: E402
from gpt import GPT, CharTokenizer, GPTConfig  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layers", type=int, default=4, help="transformer blocks")
    p.add_argument("--d-model", type=int, default=128, help="model width")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--seq-len", type=int, default=64, help="context length (characters)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--steps", type=int, default=100, help="training steps")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate")
    p.add_argument("--weight-decay", type=float, default=1e-2, help="AdamW's decoupled decay")
    p.add_argument("--placement", default="auto",
                   help="auto, cpu, gpu, or K: the number of subgroups the GPU updates")
    p.add_argument("--subgroup-size", type=int, default=None,
                   help="parameters per subgroup (%(default)s: an eighth of the model, so "
                        "that the plan has subgroups to share between the GPU and the CPU)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU update threads (%(default)s: tide's default)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="model dtype")
    p.add_argument("--state-dtype", choices=["float32", "bfloat16", "q8"], default=None,
                   help="the moments' format in tide's pinned state, q8: 8-bit block-wise "
                        "(%(default)s: TIDE_STATE_DTYPE, else float32)")
    p.add_argument("--master-dtype", choices=["float32", "bfloat16"], default=None,
                   help="the master weights: float32 (an fp32 copy in pinned memory) or "
                        "bfloat16 (the bf16 model's parameters with a bf16 compensation each; "
                        "needs --dtype bf16) (%(default)s: TIDE_MASTER_DTYPE, else float32)")
    p.add_argument("--state-rounding", choices=["nearest", "stochastic"], default=None,
                   help="how bf16 moments are rounded (stochastic needs --state-dtype bfloat16) "
                        "(%(default)s: TIDE_STATE_ROUNDING, else nearest)")
    p.add_argument("--compare", action=argparse.BooleanOptionalAction, default=False,
                   help="also train with torch.optim.AdamW from the same seed and compare")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out"),
                   help="folder for the memory timeline PNG and the Perfetto trace")
    p.add_argument("--seed", type=int, default=0, help="seeds the weights, the corpus, the batches")
    args = p.parse_args(argv)
    for name in ("layers", "d_model", "heads", "seq_len", "batch", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.placement not in ("auto", "cpu", "gpu") and not args.placement.isdigit():
        p.error(f"--placement must be auto, cpu, gpu or a number, not {args.placement!r}")
    if args.master_dtype == "bfloat16" and args.dtype != "bf16":
        p.error("--master-dtype bfloat16 needs --dtype bf16 (the model's bf16 parameters are "
                "the master weights)")
    if args.state_rounding == "stochastic" and args.state_dtype != "bfloat16":
        p.error("--state-rounding stochastic needs --state-dtype bfloat16 (it rounds bf16 moments)")
    return args


def make_batches(args, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every step's (input, target) batch, drawn up front from the seed, so that the tide run and
    the --compare run see exactly the same data."""
    tokens = CharTokenizer().encode(corpus.generate(max(200_000, 4 * args.batch * args.seq_len),
                                                    seed=args.seed))
    g = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(len(tokens) - args.seq_len - 1, (args.steps, args.batch), generator=g)
    window = torch.arange(args.seq_len + 1)
    batches = []
    for step_starts in starts:
        chunk = tokens[step_starts[:, None] + window]
        batches.append((chunk[:, :-1].to(device), chunk[:, 1:].to(device)))
    return batches


def make_model(args, device) -> GPT:
    torch.manual_seed(args.seed)  # the same initial weights for tide and --compare
    config = GPTConfig(vocab_size=CharTokenizer().vocab_size, context=args.seq_len,
                       layers=args.layers, dim=args.d_model, heads=args.heads)
    return GPT(config).to(device=device, dtype=DTYPES[args.dtype])


def tide_optimizer(args, model: GPT) -> torch.optim.Optimizer:
    n_params = sum(p.numel() for p in model.parameters())
    placement = int(args.placement) if args.placement.isdigit() else args.placement
    options = {"placement": placement,
               "subgroup_size": args.subgroup_size or -(-n_params // 8)}
    if args.threads is not None:
        options["threads"] = args.threads
    if args.state_dtype is not None:
        options["state_dtype"] = (args.state_dtype if args.state_dtype == "q8"
                                  else getattr(torch, args.state_dtype))
    if args.master_dtype is not None:
        options["master_dtype"] = getattr(torch, args.master_dtype)
    if args.state_rounding is not None:
        options["state_rounding"] = args.state_rounding
    return tide.torch.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                            **options)


def train(model, opt, batches, device, *, report=None, marks=True) -> list[dict[str, float]]:
    """The training loop; `report(step, times)` is called after every iteration. Returns each
    iteration's loss and phase times (seconds). `marks`: mark the forward and backward phases
    for tide's telemetry (tide's optimizer marks the update phase and the iteration's end)."""

    def now() -> float:
        if device.type == "cuda":  # CUDA work is asynchronous: time what has run, not what queued
            torch.cuda.synchronize(device)
        return time.perf_counter()

    history = []
    for step, (x, y) in enumerate(batches, 1):
        if marks:
            tide.torch.mark_phase("forward")
        t0 = now()
        _, loss = model(x, y)
        t1 = now()
        if marks:
            tide.torch.mark_phase("backward")
        loss.backward()
        t2 = now()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = now()
        times = {"loss": loss.item(), "forward": t1 - t0, "backward": t2 - t1, "update": t3 - t2}
        history.append(times)
        if report is not None:
            report(step, times)
    return history


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def iteration_line(step: int, steps: int, times: dict[str, float], plan: dict | None) -> str:
    line = (f"step {step:>{len(str(steps))}}/{steps}  loss {times['loss']:.4f}  "
            f"fwd {times['forward'] * 1e3:7.1f} ms  bwd {times['backward'] * 1e3:7.1f} ms  "
            f"update {times['update'] * 1e3:7.1f} ms")
    if plan is None or plan.get("skipped"):
        return line + "  (step skipped: non-finite gradients)"
    return (line + f"  subgroups gpu {plan['gpu_subgroups']} cpu {plan['cpu_subgroups']}"
            f"  headroom {human_bytes(plan['headroom_bytes'])}")


def mean_ms(history: list[dict[str, float]], key: str) -> float:
    """Mean over the iterations after the first (the first pays one-time set-up: pinned buffers,
    the first plan, allocator warm-up), or the only one."""
    kept = history[1:] or history
    return statistics.fmean(h[key] for h in kept) * 1e3


def largest_difference(model: GPT, reference: GPT) -> dict[str, float | str]:
    """The largest weight difference (absolute, and where), relative to the largest weight of the
    model, and the norm of the difference relative to the weights' norm.

    Relative to the whole model rather than to each tensor: the attention's key biases get only
    rounding noise as gradient (softmax ignores what they add), and Adam scales that noise up to
    full-size steps, so in those tensors any two correct implementations part in the last digits
    of a tensor that stays near zero."""
    names = [name for name, _ in model.named_parameters()]
    ours = [p.detach().float().cpu().flatten() for p in model.parameters()]
    theirs = [p.detach().float().cpu().flatten() for p in reference.parameters()]
    diffs = [(a - b).abs().max().item() for a, b in zip(ours, theirs, strict=True)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    all_ours, all_theirs = torch.cat(ours), torch.cat(theirs)
    return {"absolute": diffs[worst], "where": names[worst],
            "relative": diffs[worst] / all_theirs.abs().max().item(),
            "norm_relative": ((all_ours - all_theirs).norm() / all_theirs.norm()).item()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if cuda:
        tide.torch.use_allocator()  # first: before anything initialises CUDA
    device = torch.device("cuda" if cuda else "cpu")

    batches = make_batches(args, device)
    model = make_model(args, device)
    opt = tide_optimizer(args, model)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"train_gpt: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
          f"seq {args.seq_len}, batch {args.batch}: {n_params / 1e6:.2f}M parameters, "
          f"{args.dtype} on {device}; tide AdamW lr {args.lr:g}, placement {args.placement}, "
          f"{args.steps} steps", flush=True)
    fmt = opt.state_format
    rounding = f" ({fmt['rounding']} rounding)" if fmt["moments"] == "bfloat16" else ""
    print(f"train_gpt: optimizer state: {fmt['moments']} moments{rounding}, "
          f"{fmt['master']} master weights", flush=True)

    def report(step, times):
        print(iteration_line(step, args.steps, times, opt.last_plan), flush=True)

    history = train(model, opt, batches, device, report=report)
    print(f"loss {history[0]['loss']:.4f} -> {history[-1]['loss']:.4f} "
          f"(a uniform guess: {math.log(CharTokenizer().vocab_size):.4f}); mean ms per "
          f"iteration: fwd {mean_ms(history, 'forward'):.1f}, bwd "
          f"{mean_ms(history, 'backward'):.1f}, update {mean_ms(history, 'update'):.1f}")

    # Written before --compare runs, so that they show the tide run only.
    args.out.mkdir(parents=True, exist_ok=True)
    png = tide.torch.memory_timeline(args.out / "tide_memory.png", optimizer=opt)
    trace = args.out / "tide_trace.json"
    tide.torch.export_timeline(trace)

    if args.compare:
        reference = make_model(args, device)
        # PyTorch's own AdamW even under `tide run --optimizer`, which replaces torch.optim's.
        torch_adamw = tide.torch.tide_run.original("AdamW")
        ref_opt = torch_adamw(reference.parameters(), lr=args.lr,
                              weight_decay=args.weight_decay)
        ref_history = train(reference, ref_opt, batches, device, marks=False)
        diff = largest_difference(model, reference)
        print(f"compare: largest weight difference from torch.optim.AdamW: "
              f"{diff['absolute']:.3e} in {diff['where']}, relative {diff['relative']:.3e} (to "
              f"the largest weight); difference norm relative {diff['norm_relative']:.3e}")
        print(f"compare: final loss tide {history[-1]['loss']:.4f}, torch.optim.AdamW "
              f"{ref_history[-1]['loss']:.4f}")
        if args.dtype != "fp32":
            print("compare: (a bf16 model: tide updates fp32 master weights, torch.optim.AdamW "
                  "the bf16 weights themselves, so they differ by bf16 rounding, about 4e-3)")
        print(f"compare: mean step time (update phase): tide {mean_ms(history, 'update'):.1f} "
              f"ms, torch.optim.AdamW {mean_ms(ref_history, 'update'):.1f} ms")

    print(f"memory timeline: {png}")
    print(f"Perfetto trace: {trace} (open it in https://ui.perfetto.dev)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
