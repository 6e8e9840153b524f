"""`tide run --optimizer`: an unmodified PyTorch training script gets tide's AdamW (no GPU needed:
without one, tide's optimizer runs on CPU tensors over the host stand-in driver).

- Under `tide run --optimizer`, the script's optimizer is tide's and its final weights match a run
  without tide run (no preload, no hook) that picks tide's AdamW explicitly; what tide does not
  support (amsgrad=True) falls back to PyTorch's with one line; a user sitecustomize still runs;
  the exit status passes through.
- The replacements of torch.optim.AdamW/Adam (tide.torch.tide_run) against stand-in tide classes:
  isinstance/issubclass, subclasses, PyTorch's arguments, fallbacks, idempotence.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
TRAIN = FIXTURES / "train_unmodified.py"
INSTALLED = "tide run --optimizer: torch.optim.AdamW and torch.optim.Adam are tide's"


def clean_env(**extra):
    """The environment of a user's shell: no tide knobs, no preload, no PYTHONPATH (so tide must
    find its stand-in driver by itself), and no GPU in sight: the script trains on CPU tensors,
    which tide's optimizer takes in CPU mode only (on a GPU it wants CUDA tensors)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TIDE_") and k not in ("LD_PRELOAD", "PYTHONPATH")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


def run(args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300,
                          **kwargs)


def tide_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("tide run --optimizer:")]


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_close(actual, expected, rtol):
    assert actual.keys() == expected.keys()
    for name in expected:
        a, e = actual[name].double(), expected[name].double()
        scale = e.abs().max().clamp_min(1e-12)
        assert float((a - e).abs().max() / scale) <= rtol, name


@pytest.fixture(scope="module")
def tide_exe():
    exe = pathlib.Path(os.environ.get("TIDE_BUILD_DIR", FIXTURES.parents[2] / "build")) / "bin"
    exe = exe / "tide"
    assert exe.is_file(), f"{exe} is missing: build tide first (make build)"
    return exe


@pytest.fixture(scope="module")
def runs(tide_exe, tmp_path_factory):
    """The script under tide run --optimizer, with tide's AdamW picked explicitly (no tide run),
    and with PyTorch's AdamW (plain)."""
    out = tmp_path_factory.mktemp("tide_run_optimizer")
    results = {
        "tide_run": run([tide_exe, "run", "--optimizer", "--", sys.executable, TRAIN,
                         "--out", out / "tide_run.pt"], env=clean_env(), cwd=out),
        "explicit": run([sys.executable, FIXTURES / "with_tide_adamw.py", TRAIN,
                         "--out", out / "explicit.pt"], env=clean_env(), cwd=out),
        "plain": run([sys.executable, TRAIN, "--out", out / "plain.pt"], env=clean_env(),
                     cwd=out),
    }
    for name, result in results.items():
        assert result.returncode == 0, f"{name}:\n{result.stdout}\n{result.stderr}"
    return out, results


def test_the_unmodified_scripts_adamw_is_tides(runs):
    _, results = runs
    stdout = results["tide_run"].stdout.splitlines()
    assert "optimizer tide.torch.optim AdamW" in stdout, results["tide_run"].stderr
    assert "isinstance True True" in stdout, "isinstance(opt, torch.optim.AdamW) holds"
    lines = tide_lines(results["tide_run"].stderr)
    assert len(lines) == 1 and lines[0].startswith(INSTALLED), results["tide_run"].stderr
    assert "Traceback" not in results["tide_run"].stderr
    assert "optimizer torch.optim.adamw AdamW" in results["plain"].stdout.splitlines()
    assert "optimizer tide.torch.optim AdamW" in results["explicit"].stdout.splitlines()


@pytest.mark.numerics
def test_weights_match_a_run_with_tides_adamw_picked_explicitly(runs):
    out, _ = runs
    tide_run, explicit = load(out / "tide_run.pt"), load(out / "explicit.pt")
    assert_close(tide_run, explicit, rtol=1e-6)
    # And both track PyTorch's AdamW, except the attention's key bias: its gradient is zero up
    # to rounding (softmax ignores a shift of all key scores), so Adam's m/sqrt(v) there follows
    # rounding noise in either implementation.
    plain = load(out / "plain.pt")
    for weights in (tide_run, plain):
        weights.pop("attn.in_proj_bias")
    assert_close(tide_run, plain, rtol=1e-5)


def test_amsgrad_falls_back_to_pytorchs_adamw_with_one_line(tide_exe, tmp_path):
    result = run([tide_exe, "run", "--optimizer", "--", sys.executable, TRAIN, "--amsgrad",
                  "--steps", "3", "--out", tmp_path / "tide_run.pt"], env=clean_env(),
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "optimizer torch.optim.adamw AdamW" in result.stdout.splitlines()
    assert "isinstance True True" in result.stdout.splitlines()
    lines = tide_lines(result.stderr)
    assert len(lines) == 2 and lines[0].startswith(INSTALLED), result.stderr
    assert "amsgrad=True" in lines[1] and "PyTorch's AdamW" in lines[1], lines[1]
    plain = run([sys.executable, TRAIN, "--amsgrad", "--steps", "3", "--out",
                 tmp_path / "plain.pt"], env=clean_env(), cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert_close(load(tmp_path / "tide_run.pt"), load(tmp_path / "plain.pt"), rtol=0.0)


def test_a_user_sitecustomize_still_runs(tide_exe, tmp_path):
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text(
        "import sys\nsys.stderr.write('user sitecustomize ran\\n')\n")
    result = run([tide_exe, "run", "--optimizer", "--", sys.executable, TRAIN, "--steps", "2",
                  "--out", tmp_path / "w.pt"], env=clean_env(PYTHONPATH=str(user)), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines().count("user sitecustomize ran") == 1, result.stderr
    assert "optimizer tide.torch.optim AdamW" in result.stdout.splitlines()


def test_the_exit_status_passes_through(tide_exe, tmp_path):
    result = run([tide_exe, "run", "--optimizer", "--", sys.executable, TRAIN, "--steps", "1",
                  "--exit-code", "7", "--out", tmp_path / "w.pt"], env=clean_env(), cwd=tmp_path)
    assert result.returncode == 7, result.stderr
    assert "optimizer tide.torch.optim AdamW" in result.stdout.splitlines()
    assert (tmp_path / "w.pt").is_file()


# ---- the replacements, against stand-in tide classes (fixtures/replacement_checks.py) ----


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    result = run([sys.executable, FIXTURES / "replacement_checks.py"], env=clean_env(),
                 cwd=tmp_path_factory.mktemp("replacement_checks"))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_replacements_are_installed_once_and_the_originals_stay_reachable(checks):
    assert checks["installed"]
    assert checks["originals"] == [True, True], "tide_run.original('AdamW'/'Adam')"
    assert checks["replaced"] == [True, True, True, True], "torch.optim and its modules"
    assert checks["stderr"][0] == INSTALLED + " (tide.torch.AdamW, tide.torch.Adam)"
    assert sum(l.startswith(INSTALLED) for l in checks["stderr"]) == 1, "idempotent"


def test_pytorchs_arguments(checks):
    kinds = checks["kinds"]
    assert kinds["plain"] == kinds["fused"] == kinds["tensor_lr"] == "tide.torch.optim.AdamW", (
        "foreach/fused and PyTorch's defaults (amsgrad=False, ...) keep tide's optimizer")
    assert kinds["decoupled"] == "tide.torch.optim.AdamW", "Adam(decoupled_weight_decay=True)"
    assert checks["calls"][2] == {"class": "AdamW", "lr": 0.001, "weight_decay": 0.05,
                                  "maximize": False}
    assert "no_such_argument" in checks["refused"], "PyTorch's own TypeError"
    assert checks["grouped"] == ["tide.torch.optim.AdamW", 2, 0.5], "a group's generator is read"


def test_what_tide_does_not_support_falls_back_to_pytorchs_with_one_line(checks):
    kinds = checks["kinds"]
    assert kinds["positional_amsgrad"] == "torch.optim.adamw.AdamW"
    assert kinds["capturable"] == "torch.optim.adam.Adam"
    assert kinds["decoupled_amsgrad"] == "torch.optim.adam.Adam"
    assert kinds["double"] == "torch.optim.adamw.AdamW"
    assert kinds["cannot_run"] == "torch.optim.adamw.AdamW", "tide.TideError while building"
    kept = checks["fallback_keeps_arguments"]
    assert kept["positional_amsgrad"] == [True, [0.9, 0.99]]
    assert kept["decoupled_amsgrad"] == [True, True]
    assert kept["cannot_run_params"] == 2, "a generator of parameters is read once, for both"
    lines = checks["stderr"]
    for needle in ("amsgrad=True", "capturable=True", "float64 parameters",
                   "cannot run here (no usable device (a test's))"):
        assert sum(needle in l for l in lines) >= 1, (needle, lines)


def test_isinstance_and_issubclass_answer_as_pytorch(checks):
    assert all(checks["isinstance"][k] for k in (
        "tide AdamW is torch AdamW", "tide AdamW is torch Adam", "tide AdamW is Optimizer",
        "tide Adam is torch Adam", "PyTorch's AdamW is torch AdamW",
        "PyTorch's Adam is torch Adam", "derived is torch AdamW")), checks["isinstance"]
    assert not checks["isinstance"]["tide Adam is torch AdamW"]
    assert not checks["isinstance"]["PyTorch's Adam is torch AdamW"]
    sub = checks["issubclass"]
    assert sub["AdamW of Adam"] and not sub["Adam of AdamW"] and sub["AdamW of Optimizer"]
    assert sub["tide's AdamW of Adam"] and not sub["tide's Adam of AdamW"]
    assert checks["signature"], "inspect.signature(torch.optim.AdamW) is PyTorch's"
    assert checks["pickled_class"] and checks["scheduler"] == "StepLR"


def test_a_subclass_keeps_pytorchs_class_with_one_line(checks):
    assert checks["kinds"]["derived"] == "__main__.Derived"
    assert checks["issubclass"]["Derived's base"] == [True]
    assert checks["issubclass"]["Derived of AdamW"]
    assert any(l.endswith("Derived derives from torch.optim.AdamW, so it keeps PyTorch's AdamW "
                          "(a subclass relies on PyTorch's implementation)")
               for l in checks["stderr"])


def test_a_failing_install_never_fails_import_torch(checks):
    assert checks["install_failure"] == [
        "tide run --optimizer: could not install tide's optimizer (ZeroDivisionError: division "
        "by zero); running the program with PyTorch's"]


# ---- what tide run --optimizer says (fixtures/tide_run_messages.py) ----


@pytest.fixture(scope="module")
def messages(tide_exe, tmp_path_factory):
    result = run([tide_exe, "run", "--optimizer", "--", sys.executable,
                  FIXTURES / "tide_run_messages.py"], env=clean_env(),
                 cwd=tmp_path_factory.mktemp("tide_run_messages"))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("case, message", [
    ("empty", "optimizer got an empty parameter list"),
    ("negative_lr", "Invalid learning rate: -1"),
    ("negative_lr_amsgrad", "Invalid learning rate: -1")])
def test_when_pytorch_refuses_the_call_too_its_error_comes_alone(messages, case, message):
    assert messages[case]["error"] == [message, True], "PyTorch's error, nothing chained"
    assert messages[case]["lines"] == [], "no line about an optimizer that was not built"


def test_pytorchs_refusal_is_one_traceback_under_tide_run(tide_exe, tmp_path):
    result = run([tide_exe, "run", "--optimizer", "--", sys.executable, "-c",
                  "import torch; torch.optim.AdamW([], lr=1e-3)"], env=clean_env(), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.count("Traceback") == 1, result.stderr
    assert "During handling" not in result.stderr
    assert "ValueError: optimizer got an empty parameter list" in result.stderr
    assert tide_lines(result.stderr) == [INSTALLED + " (tide.torch.AdamW, tide.torch.Adam)"]


def test_a_derived_class_is_said_once_when_built_never_at_import(messages):
    entry = messages["subclasses"]
    assert entry["lines"] == [
        f"tide run --optimizer: {name} derives from torch.optim.AdamW, so it keeps PyTorch's "
        "AdamW (a subclass relies on PyTorch's implementation)" for name in ("Built", "BuiltToo")]
    assert entry["built"] == ["torch.optim.adamw", "first", 0.5, "x", True]
    assert entry["signature"] == "(params, lr=0.001, tag='x')"


def test_fused_is_said_once_and_kept_in_the_param_groups(messages):
    entry = messages["fused"]
    assert entry["lines"] == [
        "tide run --optimizer: torch.optim.AdamW(fused=True): tide's optimizer runs its own "
        "fused update and ignores this choice among PyTorch's implementations; fused=True stays "
        "in its param groups and checkpoints, as PyTorch's would keep it"]
    assert entry["kept"] == ["tide.torch.optim", True, True, True, True, "tide.torch.optim"]
