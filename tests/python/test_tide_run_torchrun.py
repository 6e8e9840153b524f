"""`tide run --optimizer -- torchrun ...`: the start-up hook reaches every rank torchrun starts
(PYTHONPATH and LD_PRELOAD pass through torchrun's agent to its workers), so each rank's
torch.optim.AdamW is tide's. Two ranks, gloo on CPU, one step each."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def tide_exe():
    exe = pathlib.Path(os.environ.get("TIDE_BUILD_DIR", FIXTURES.parents[2] / "build")) / "bin"
    return exe / "tide"


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TIDE_") and k not in ("LD_PRELOAD", "PYTHONPATH")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return env


def torchrun(*args):
    # What the torchrun console script runs, with this interpreter: a copied virtual environment's
    # script may name another one in its #! line.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            *map(str, args)]


def ranks_of(directory):
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(2)
            if (directory / f"rank{r}.json").is_file()]


def test_every_rank_gets_tides_adamw(tmp_path):
    assert tide_exe().is_file(), "build tide first (make build)"
    result = subprocess.run(
        [str(tide_exe()), "run", "--optimizer", "--", *torchrun(FIXTURES / "ranks_optimizer.py")],
        capture_output=True, text=True, timeout=240, env=clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = ranks_of(tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1], result.stdout + result.stderr
    for r in ranks:
        assert r["optimizer"] == "tide.torch.optim.AdamW", r
        assert r["local_world_size"] == 2
    assert "Traceback" not in result.stderr, result.stderr


def test_without_tide_run_the_ranks_keep_pytorchs(tmp_path):
    result = subprocess.run(torchrun(FIXTURES / "ranks_optimizer.py"), capture_output=True,
                            text=True, timeout=240, env=clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = ranks_of(tmp_path)
    assert len(ranks) == 2, result.stdout + result.stderr
    assert {r["optimizer"] for r in ranks} == {"torch.optim.adamw.AdamW"}
