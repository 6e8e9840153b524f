"""tide's AdamW in the trainers people use: plain PyTorch, Hugging Face `Trainer` (tide's class
given to it, or an optimizer of one's own), PyTorch Lightning, and an unmodified `Trainer` script
under `tide run --optimizer`; with gradient accumulation, clipping, a warmup schedule, and
checkpoints that move between tide and PyTorch both ways.

The code under test is the snippets of docs/guide/trainers.md (README.md repeats some). Each run
is compared with the same training where the snippet's `tide.torch.AdamW` is torch.optim.AdamW's
for-loop implementation (torch_reference.py): every forward pass's loss, and the final weights,
within what PyTorch's own implementations (fused; the reference from weights nudged by one
rounding) differ by on this machine. A tiny GPT-2 built from a config, on the CPU: no download.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded, ever
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import tide.torch as tt  # noqa: E402
from torch_reference import TorchReference, max_rel_diff  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from tiny_gpt2 import (DEVICE, record_losses, tiny_dataset, tiny_model,  # noqa: E402
                       training_args)

pytestmark = pytest.mark.numerics
LOSS_FLOOR = 1e-5  # relative: a few roundings of the loss


# ---- the documented snippets --------------------------------------------------------------------

PAGE = "docs/guide/trainers.md"  # every tested snippet; README.md repeats some of them


def marked(path: str, name: str, language: str) -> str | None:
    text = (REPO / path).read_text()
    match = re.search(rf"<!-- tested: {re.escape(name)} -->\n```{language}\n(.*?)```", text,
                      re.DOTALL)
    return match.group(1) if match else None


def snippet(name: str, language: str = "python") -> str:
    """The code block the trainers page marks `<!-- tested: NAME -->`; where README.md shows a
    block with the same mark, it must be the same code."""
    code = marked(PAGE, name, language)
    assert code is not None, f"{PAGE} has no snippet marked <!-- tested: {name} -->"
    in_readme = marked("README.md", name, language)
    assert in_readme is None or in_readme == code, \
        f"README.md's <!-- tested: {name} --> block differs from {PAGE}'s"
    return code


def test_readme_snippets_are_the_tested_ones():
    """Every snippet README.md marks as tested is one of the trainers page's, unchanged."""
    readme = (REPO / "README.md").read_text()
    names = re.findall(r"<!-- tested: ([\w-]+) -->\n```(\w+)", readme)
    assert names, "README.md shows no tested snippet"
    for name, language in names:
        snippet(name, language)


def load(name: str, torch_options: dict | None = None) -> dict:
    """The snippet's definitions; with `torch_options`, its tide.torch.AdamW is
    torch.optim.AdamW(**torch_options) instead (the reference)."""
    namespace = {"__name__": f"docs_{name.replace('-', '_')}"}
    exec(compile(snippet(name), f"{PAGE} <!-- tested: {name} -->", "exec"), namespace)
    if torch_options is not None:
        class AdamW(torch.optim.AdamW):  # a class: Trainer calls anything else a factory
            def __init__(self, params, *args, **kwargs):
                super().__init__(params, *args, **kwargs, **torch_options)

        namespace["tide"] = types.SimpleNamespace(torch=types.SimpleNamespace(AdamW=AdamW))
    return namespace


def loss_difference(ours: dict, reference: dict) -> float:
    a, b = ours["losses"], reference["losses"]
    assert len(a) == len(b) > 0
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def assert_losses_close(ours: dict, ref: TorchReference, *, skip: int = 0) -> None:
    """Every forward pass's loss (from the `skip`-th on) within the measured bound."""
    bound = ref.bound_on(loss_difference, LOSS_FLOOR)
    tail = {"losses": ref.result["losses"][skip:]}
    assert loss_difference(ours, tail) <= bound, (ours["losses"], tail["losses"], bound)


def inner(optimizer):
    """The optimizer inside accelerate's wrapper (Trainer) or Lightning's."""
    return getattr(optimizer, "optimizer", getattr(optimizer, "_optimizer", optimizer))


# ---- plain PyTorch -----------------------------------------------------------------------------


def run_plain(model, options=None):
    losses = record_losses(model)
    batches = torch.utils.data.DataLoader(tiny_dataset(), batch_size=4)  # 12 micro-batches
    optimizer = load("plain", options)["train"](model, batches)
    return {"losses": losses, "optimizer": optimizer}


def test_plain_pytorch():
    ref = TorchReference(tiny_model, run_plain)
    model = tiny_model()
    ours = run_plain(model)
    assert type(ours["optimizer"]) is tt.AdamW and ours["optimizer"].last_plan["step"] == 6
    ref.assert_close(model)
    assert_losses_close(ours, ref)


# ---- Hugging Face Trainer ----------------------------------------------------------------------


def run_trainer(function: str, output_dir, *, options=None, model=None, resume=None):
    """The trainers page's `function` (from the trainer snippet), trained: its Trainer, losses, model."""
    model = model if model is not None else tiny_model()
    losses = record_losses(model)
    trainer = load("trainer", options)[function](model, training_args(output_dir), tiny_dataset())
    trainer.train(resume_from_checkpoint=resume)
    return {"trainer": trainer, "losses": losses, "model": model, "output_dir": output_dir}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("trainer_runs")


def trainer_reference(function: str, runs: pathlib.Path) -> TorchReference:
    count = itertools.count()
    return TorchReference(tiny_model, lambda model, options: run_trainer(
        function, runs / f"torch_{function}_{next(count)}", options=options, model=model))


@pytest.fixture(scope="module")
def reference(runs):
    """torch.optim.AdamW (for-loop) in Trainer's own param groups: the reference of
    trainer_with_tide, of the unmodified script, and of the resumed runs."""
    return trainer_reference("trainer_with_tide", runs)


@pytest.fixture(scope="module")
def tide_run_of_trainer(runs):
    return run_trainer("trainer_with_tide", runs / "tide")


def test_trainer_with_tides_class(reference, tide_run_of_trainer):
    ours, ref = tide_run_of_trainer, reference
    optimizer = inner(ours["trainer"].optimizer)
    assert type(optimizer) is tt.AdamW and optimizer.last_plan["step"] == 6
    # Trainer's param groups: weight decay except on biases and norms.
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    ref.assert_close(ours["model"])
    assert_losses_close(ours, ref)
    # Its schedule, on tide's optimizer: warmup, then linear decay to 0.
    history = ours["trainer"].state.log_history
    lrs = [h["learning_rate"] for h in history if "learning_rate" in h]
    assert lrs == [h["learning_rate"] for h in ref.result["trainer"].state.log_history
                   if "learning_rate" in h]
    assert lrs[0] < lrs[1] and lrs[1] > lrs[-1]
    assert max(h["grad_norm"] for h in history if "grad_norm" in h) > 0.5, "clipping mattered"
    assert (ours["output_dir"] / "checkpoint-3" / "optimizer.pt").is_file()


def test_trainer_with_your_optimizer(runs):
    ours = run_trainer("trainer_with_your_optimizer", runs / "tide_own")
    ref = trainer_reference("trainer_with_your_optimizer", runs)
    optimizer = inner(ours["trainer"].optimizer)
    assert type(optimizer) is tt.AdamW and optimizer.last_plan["step"] == 6
    ref.assert_close(ours["model"])
    assert_losses_close(ours, ref)


@pytest.mark.parametrize("saved_by, resumed_by", [("tide", "torch"), ("torch", "tide")])
def test_trainer_checkpoints_move_between_tide_and_torch(runs, reference, tide_run_of_trainer,
                                                         saved_by, resumed_by):
    """A run saved at update 3, resumed by the other optimizer for updates 4 to 6: the same
    losses and weights as the reference's run straight through, and the state it loaded (the
    step count) carried on."""
    saved = tide_run_of_trainer if saved_by == "tide" else reference.result
    resumed = run_trainer("trainer_with_tide", runs / f"{saved_by}_then_{resumed_by}",
                          options=None if resumed_by == "tide" else {"foreach": False},
                          resume=str(saved["output_dir"] / "checkpoint-3"))
    optimizer = inner(resumed["trainer"].optimizer)
    assert (type(optimizer) is tt.AdamW) == (resumed_by == "tide")
    assert {int(s["step"]) for s in optimizer.state.values()} == {6}
    reference.assert_close(resumed["model"], f"saved by {saved_by}, resumed by {resumed_by}")
    assert_losses_close(resumed, reference, skip=6)  # 2 forward passes per update


def test_an_unmodified_trainer_script_under_tide_run(build_dir, runs, reference):
    """The documented command, on a Trainer script with its default optimizer (PyTorch's fused AdamW):
    straight through, and resuming the reference's checkpoint; then PyTorch resumes its
    checkpoint."""
    tide_exe = build_dir / "bin" / "tide"
    script = FIXTURES / "hf_train.py"
    command = [{"tide": str(tide_exe), "python": sys.executable, "train.py": str(script)}.get(w, w)
               for w in shlex.split(snippet("tide-run", "sh"))]
    # A user's environment: no tide knobs, no preload; the GPU, if any, in sight (as for the
    # reference, which runs on the same device).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TIDE_") and k not in ("LD_PRELOAD", "PYTHONPATH")}
    straight, resumed = runs / "tide_run", runs / "tide_run_resumed"
    processes = [subprocess.Popen(command + [str(straight)], env=env, cwd=runs, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE),
                 subprocess.Popen(command + [str(resumed), "--resume",
                                             str(reference.result["output_dir"] / "checkpoint-3")],
                                  env=env, cwd=runs, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        lines = [l for l in stderr.splitlines() if l.startswith("tide run --optimizer:")]
        assert len(lines) == 2, stderr
        assert lines[0].startswith("tide run --optimizer: torch.optim.AdamW and torch.optim.Adam "
                                   "are tide's")
        assert lines[1].startswith("tide run --optimizer: torch.optim.AdamW(fused=True): ")
        assert "Traceback" not in stderr

    def weights(directory):
        model = tiny_model(seed=1)
        model.load_state_dict(torch.load(directory / "weights.pt", map_location=DEVICE,
                                         weights_only=True))
        return model

    # fused: what the program passed; after resuming, what the checkpoint's groups had (as with
    # PyTorch's load_state_dict): the reference's for-loop AdamW saved None.
    for directory, skip, fused in ((straight, 0, True), (resumed, 6, None)):
        result = json.loads((directory / "result.json").read_text())
        assert result["optimizer"] == "tide.torch.optim.AdamW" and result["fused"] is fused
        reference.assert_close(weights(directory), directory.name)
        assert_losses_close(result, reference, skip=skip)

    # PyTorch (for-loop) resumes what the tide run saved.
    back = run_trainer("trainer_with_tide", runs / "tide_run_then_torch",
                       options={"foreach": False}, resume=str(straight / "checkpoint-3"))
    reference.assert_close(back["model"], "saved under tide run, resumed by torch")
    assert_losses_close(back, reference, skip=6)


# ---- PyTorch Lightning -------------------------------------------------------------------------


def test_lightning(tmp_path):
    def run(model, options):
        losses = record_losses(model)
        loader = torch.utils.data.DataLoader(tiny_dataset(), batch_size=4)
        trainer = load("lightning", options)["fit"](
            model, loader, accelerator="gpu" if DEVICE == "cuda" else "cpu", devices=1,
            logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=str(tmp_path))
        return {"losses": losses, "trainer": trainer}

    ref = TorchReference(tiny_model, run)
    model = tiny_model()
    ours = run(model, None)
    optimizer = inner(ours["trainer"].optimizers[0])
    assert type(optimizer) is tt.AdamW and optimizer.last_plan["step"] == 6
    assert len(ours["losses"]) == 12, "6 updates of 2 micro-batches"
    scheduler = ours["trainer"].lr_scheduler_configs[0].scheduler
    assert scheduler.get_last_lr() == (
        ref.result["trainer"].lr_scheduler_configs[0].scheduler.get_last_lr())
    ref.assert_close(model)
    assert_losses_close(ours, ref)
