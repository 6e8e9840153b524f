"""A fault soak: a step happens exactly, or not at all, under faults drawn at random
(docs/design/runtime.md, CPU mode, the stand-in driver's fault injection). The loop is
soak_run.soak; this module has the configurations.

Per configuration (placements cpu, gpu, K=2 and auto; fp32, bf16 and 8-bit moments; bf16
masters; host-resident parameters; FSDP2's host-resident shards at 2 gloo ranks) a small model
is trained for SOAK_STEPS step attempts. Before each attempt a seeded schedule (random.Random,
seeded from the seed and the attempt's number) draws what happens to it: one of

- nothing;
- a failing copy (the n-th copy of the step, n drawn over the copies a fault-free step makes);
- a failing device allocation (likewise);
- a failing copy and a failing allocation, both armed;
- a failing kernel launch (likewise, over the launches);
- a failing host pinning: the host cannot lock more memory where the step grows its pinned
  arena. Steady steps pin nothing (the arena keeps what it has); an optimizer's first step
  registers a chunk for its spare slots when its state filled the first one, as the wide
  model's does: so the attempt goes on with a fresh optimizer from the last state (a resume)
  and one of its first step's pinnings fails. Drawn in the wide configuration only; the step
  must complete (the subgroups without pinned memory are updated on the CPU);
- the device lost at a driver call inside the step, or between steps (its first call);

and, independently of those, a non-finite gradient (inf, -inf or NaN in a few elements of one
gradient) and a load_state_dict of the optimizer's current state before the step.

After every attempt the contract is checked against a fault-free reference optimizer (same
configuration, same gradients) that replays only the steps that happened: either step()
returned and the model's weights and opt.state_dict() are bit for bit the reference's after the
same number of completed steps, or step() raised and everything is bit for bit what it was
before (the same step is then attempted again). Nothing is written after step() returns: the
snapshot is taken again after short sleeps, and after the stand-in's queued work has run.

A lost device is not given back to the same optimizer: the run goes on with a fresh model and a
fresh optimizer loaded from the old one's weights and state_dict() (taken once the step's
outcome was checked), as a job that lost its GPU would resume from its last state; the fresh
optimizer's snapshot must equal the old one's bit for bit.

A non-finite gradient element is left unchanged, its weight and moments keeping their values,
and counted (opt.last_plan["nonfinite"]; docs/reference/c-abi.md, docs/guide/fsdp.md): checked
for the elements, and against the reference's count.

The FSDP2 configuration (fully_shard with CPUOffloadPolicy: tide steps the fp32 shards where
FSDP2 keeps them, in host memory) runs the same loop on each of 2 gloo ranks over its own
shards, both drawing the same schedule so that a lost device makes both resume and backward's
collectives stay in step (fsdp_workers.scenario_soak).

`make test` runs a short soak (SOAK_STEPS, default 48 attempts per configuration, and
SOAK_FSDP_STEPS, default 24, for the FSDP2 one; under two minutes on two cores); `make soak`
runs many more. SOAK_SEED picks the seed (default 27). A failure names the seed, the
configuration, the rank and the step attempt, which replay it. The last line (with -s) is the
summary: attempts, steps completed and raised, and per fault kind how often it was drawn and how
often it fired (met the step: a fault armed beyond the step's last copy fails nothing).
"""

from __future__ import annotations

import contextlib
import os

import pytest

torch = pytest.importorskip("torch")
import tide.torch as tt  # noqa: E402
from soak_run import FAULTS, Config, soak  # noqa: E402
from standin_faults import Net, Standin  # noqa: E402

if torch.cuda.is_available():
    pytest.skip("fault injection needs the stand-in driver (CPU mode)", allow_module_level=True)

STEPS = int(os.environ.get("SOAK_STEPS", "48"))
SEED = int(os.environ.get("SOAK_SEED", "27"))
# The FSDP2 configuration's attempts: two processes that start PyTorch and gloo and step in
# turn on two cores, so fewer in `make test` (its budget); `make soak` gives it as many as the
# others.
FSDP_STEPS = int(os.environ.get("SOAK_FSDP_STEPS", "24"))
# The wide model's extra parameter and subgroups: its state (direct buffers, TIDE_PINNED_DIRECT)
# fills the pinned arena's first chunk, so that an optimizer's first step registers another for
# its spare slots. Tuned to the arena's layout: test_soak[k2-wide-pinning] fails if a drawn
# pinning fault meets no pinning (the layout changed), rather than soak without them.
WIDE = 110000
WIDE_SUBGROUP = 32768

CONFIGS = [
    Config("cpu-fp32", "cpu"),
    Config("gpu-fp32", "gpu"),
    Config("k2-fp32", 2),
    Config("auto-fp32", "auto"),
    Config("gpu-bf16-moments", "gpu", torch.bfloat16, torch.bfloat16),
    Config("k2-q8", 2, torch.bfloat16, "q8"),
    Config("gpu-bf16-masters", "gpu", torch.bfloat16, torch.float32, torch.bfloat16),
    Config("k2-host-params", 2, host=True),
    Config("cpu-q8", "cpu", torch.bfloat16, "q8"),
    Config("auto-bf16-moments", "auto", torch.bfloat16, torch.bfloat16),
    Config("k2-bf16-params", 2, torch.bfloat16),
    Config("k2-bf16-masters", 2, torch.bfloat16, torch.float32, torch.bfloat16),
    Config("gpu-host-params", "gpu", host=True),
    Config("k2-two-buckets", 2, two_groups=True),
    # Pinning faults: a first step grows the pinned arena (its spare slots) when the state filled
    # the arena's first chunk, which Net's 624 parameters never do.
    Config("k2-wide-pinning", 2, model="wide", subgroup=WIDE_SUBGROUP),
    # FSDP2 with CPUOffloadPolicy: tide steps the host-resident shards where they are, at 2 gloo
    # ranks (fsdp_workers.scenario_soak).
    Config("fsdp2-host-shards", 2, host=True, model="fsdp2", subgroup=8),
]


class WideNet(Net):
    """Net and a parameter of WIDE elements (fp32), fitted to a target drawn per step."""

    def __init__(self, dtype):
        super().__init__(dtype)
        g = torch.Generator().manual_seed(1)
        self.wide = torch.nn.Parameter(torch.randn(WIDE, generator=g) * 0.1)

    def loss(self, step):
        g = torch.Generator().manual_seed(200 + step)
        target = torch.randn(WIDE, generator=g)
        return super().loss(step) + ((self.wide - target) ** 2).mean()


def make(config, weights=None, state=None):
    model = (WideNet if config.model == "wide" else Net)(config.dtype)
    if weights is not None:
        with torch.no_grad():
            for p, w in zip(model.parameters(), weights):
                p.copy_(w)
    # The wide model's slots and spares are direct buffers from the arena's chunks (not
    # jemalloc's size classes), so that the state leaves no room for a first step's spares.
    direct = {"TIDE_PINNED_DIRECT": "16K"} if config.model == "wide" else {}
    params = list(model.parameters())
    if config.two_groups:
        # In the parameters' order, which the state dict's indices follow.
        params = [{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}]
    with environment(direct):
        opt = tt.AdamW(params, lr=1e-2, weight_decay=0.1,
                       subgroup_size=config.subgroup, placement=config.placement,
                       state_dtype=config.state_dtype, master_dtype=config.master_dtype,
                       host_params=config.host)
    if state is not None:
        opt.load_state_dict(state)
    return model, opt


@pytest.fixture(autouse=True)
def no_residency(monkeypatch):
    # The contract is checked by reading the state after every step, with the device lost among
    # the faults: resident state would be lost with it (the documented window), and reading it is
    # a copy the faults can hit. Resident state's faults: test_step_faults.py, executor_residency_test.
    monkeypatch.setenv("TIDE_RESIDENCY", "off")


@contextlib.contextmanager
def environment(values):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def standin():
    make(CONFIGS[0])  # loads tide over the stand-in (CPU mode)
    s = Standin()
    s.disarm()
    yield s
    s.disarm()


@pytest.fixture(scope="module")
def totals():
    counts = {}
    yield counts
    drawn = {k: v for k, v in counts.items() if k in FAULTS}
    fired = {k.split()[0]: v for k, v in counts.items() if k.endswith(" fired")}
    rest = {k: v for k, v in counts.items() if k not in drawn and not k.endswith(" fired")}
    print(f"\nsoak summary: SOAK_SEED={SEED} SOAK_STEPS={STEPS} SOAK_FSDP_STEPS={FSDP_STEPS}: "
          f"{rest}; faults drawn {drawn}; fired {fired}")


def add(totals, counts, record_property):
    for key, value in counts.items():
        record_property(key, value)
        totals[key] = totals.get(key, 0) + value


def describe(config, seed):
    return f"SOAK_SEED={SEED} (seed {seed}), configuration {config.name}: {config.describe()}"


SINGLE = [c for c in CONFIGS if c.model != "fsdp2"]


@pytest.mark.parametrize("config", SINGLE, ids=[c.name for c in SINGLE])
def test_soak(standin, totals, record_property, config):
    seed = SEED * 1000 + CONFIGS.index(config)
    where = describe(config, seed)
    counts = soak(config, make, standin, seed, STEPS, where)
    if config.pins_at_steps:
        # The configuration exists for its pinning faults: each drawn must have met a pinning.
        assert counts["fail_pin fired"] == counts["fail_pin"], (where, counts)
    add(totals, counts, record_property)
    totals["configurations"] = totals.get("configurations", 0) + 1
    print(f"\n{where}: {counts}")


FSDP = [c for c in CONFIGS if c.model == "fsdp2"]


@pytest.mark.parametrize("config", FSDP, ids=[c.name for c in FSDP])
def test_soak_fsdp2(standin, totals, record_property, tmp_path, config):
    """Each of 2 gloo ranks soaks its own host-resident shards; the ranks draw the same events
    (a device lost on both: both resume with fresh optimizers, and backward's collectives stay
    in step), each from its own seed for where in its step a fault lands."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("needs torch.distributed (gloo)")
    import fsdp_workers

    seed = SEED * 1000 + CONFIGS.index(config)
    where = describe(config, seed)
    os.environ["SOAK_RUN"] = repr((config.name, config.placement, config.subgroup, seed,
                                   FSDP_STEPS, where))
    try:
        results = fsdp_workers.launch("soak", tmp_path, world=2, timeout_s=600.0)
    finally:
        del os.environ["SOAK_RUN"]
    # Every rank's error: the first to fail makes the other's collectives fail too.
    errors = [f"rank {rank} ({r['seconds_to_error']:.1f} s): {r['error']}\n{r['traceback']}"
              for rank, r in enumerate(results) if "error" in r]
    assert not errors, "\n".join(errors)
    for rank, r in enumerate(results):
        assert r["host_resident_elements"] > 0, (where, rank, r)  # what this configuration is for
        add(totals, r["counts"], record_property)
        print(f"\n{where}, rank {rank}: {r['counts']}")
    totals["configurations"] = totals.get("configurations", 0) + 1
