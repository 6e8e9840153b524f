"""TIDE_NODE_PINNED_LIMIT: two local ranks (two processes with LOCAL_RANK / LOCAL_WORLD_SIZE, as
torchrun starts them) each get half of the node's cap. Within it an arena grows; past it the
growth fails with an out-of-memory error naming the knob, and the process carries on."""

import json
import re
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

RANK = r"""
import json, sys
from tide import _lib, pinned
arena = pinned.PinnedArena()
first = arena.alloc(24 << 20)          # within the 32 MiB share
error = None
try:
    arena.alloc(24 << 20)              # 48 MiB in all: past it
except _lib.TideError as e:
    error = str(e)
after = arena.alloc(1 << 20)           # the arena still works
print(json.dumps({"node": pinned.node_stats(), "error": error}))
"""


def run_ranks(limit):
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["TIDE_NODE_PINNED_LIMIT"] = limit
    procs = [subprocess.Popen([sys.executable, "-c", RANK], env={**env, "LOCAL_RANK": str(r),
                                                                  "LOCAL_WORLD_SIZE": "2"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_each_rank_gets_its_share_and_growth_past_it_is_a_clear_error():
    for rank, result in enumerate(run_ranks("64MiB")):
        node = result["node"]
        assert node["local_rank"] == rank and node["local_ranks"] == 2
        assert node["node_limit_bytes"] == 64 << 20
        assert node["rank_limit_bytes"] == 32 << 20
        assert 25 << 20 <= node["pinned_bytes"] <= 32 << 20, node
        assert result["error"] is not None, "growth past the share was allowed"
        assert "TIDE_NODE_PINNED_LIMIT" in result["error"], result["error"]
        assert "LOCAL_WORLD_SIZE=2" in result["error"], result["error"]


def test_without_the_knob_there_is_no_cap():
    for result in run_ranks(""):
        assert result["error"] is None
        assert result["node"]["rank_limit_bytes"] == 0


def test_a_bad_value_names_the_knob():
    env = {**os.environ, "TIDE_NODE_PINNED_LIMIT": "lots"}
    result = subprocess.run([sys.executable, "-c", "from tide import pinned; pinned.node_stats()"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "TIDE_NODE_PINNED_LIMIT" in result.stderr, result.stderr


def test_tide_env_says_where_this_rank_stands(build_dir):
    tide = build_dir / "bin" / "tide"
    env = {**os.environ, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "TIDE_NODE_PINNED_LIMIT": "64MiB"}
    result = subprocess.run([str(tide), "env"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    node = [l for l in result.stdout.splitlines() if l.startswith("node: ")]
    assert len(node) == 1, result.stdout
    assert node[0].startswith("node: local rank 1 of 2"), node[0]
    assert "32.0 MiB for this rank of the node's 64.0 MiB" in node[0], node[0]
    env["LOCAL_RANK"] = "2"
    result = subprocess.run([str(tide), "env"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert 'LOCAL_RANK="2" is not valid' in result.stderr, result.stderr


def test_a_small_limit_says_its_sizes_in_units_that_fit():
    """With TIDE_NODE_PINNED_LIMIT=1MiB every size in the refusal read 0.00 GiB (issue 27): each
    is now in the unit that fits, and sizes that differ read differently."""
    code = ("from tide import _lib, pinned\n"
            "try:\n    pinned.PinnedArena().alloc(4 << 20)\n"
            "except _lib.TideError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    result = subprocess.run([sys.executable, "-c", code], env={**env, "TIDE_NODE_PINNED_LIMIT":
                                                               "1MiB"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    message = result.stdout
    sizes = re.findall(r"(\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)\b", message)
    assert len(sizes) == 4, message
    assert all(float(number) >= 1 for number, _ in sizes), message
    assert "share 1.00 MiB of TIDE_NODE_PINNED_LIMIT=1.00 MiB" in message, message
    growth = sizes[0]
    assert growth[1] == "MiB" and float(growth[0]) > 1, message  # past the 1 MiB share


# Optimizer state past the rank's pinned share (issue 27): held in pageable memory, updated on the
# CPU, said once on stderr; the training is the same, bit for bit, as with all of it pinned.
PAGEABLE = r"""
import hashlib, json, sys, warnings
import torch, tide.torch as tt
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"  # where tide steps parameters
layers = [torch.nn.Linear(512, 512) for _ in range(4)]  # 1.05M parameters
m = torch.nn.Sequential(*layers).to(device)
placement = int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt = tt.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, placement=placement,
                   subgroup_size=1 << 16)
said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
for step in range(3):
    opt.zero_grad()
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(step)).to(device)
    m(x).square().mean().backward()
    opt.step()
digest = hashlib.sha256()
for p in m.parameters():
    digest.update(p.detach().cpu().numpy().tobytes())
    for key in ("exp_avg", "exp_avg_sq"):
        digest.update(opt.state[p][key].detach().cpu().numpy().tobytes())
print(json.dumps({"digest": digest.hexdigest(), "warnings": said}))
"""


def train(placement, limit):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "TIDE_NODE_PINNED_LIMIT")}
    if limit:
        env["TIDE_NODE_PINNED_LIMIT"] = limit
    result = subprocess.run([sys.executable, "-c", PAGEABLE, str(placement)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.parametrize("placement", ["cpu", "gpu", 2, "auto"])
def test_state_past_the_pinned_share_is_pageable_and_trains_the_same(placement):
    # About 17 MB of state and gradients: an 8 MiB share pins part of it.
    limited, stderr = train(placement, "8MiB")
    pinned, _ = train(placement, "")
    # Said once by the library (stderr, for every caller of the C ABI) and once to the program.
    lines = [line for line in stderr.splitlines() if line.startswith("tide: optimizer state:")]
    assert len(lines) == 1 and "pageable memory" in lines[0], stderr
    assert "updated on the CPU only" in lines[0], lines[0]
    assert "TIDE_NODE_PINNED_LIMIT=8.00 MiB" in lines[0], lines[0]
    assert re.search(r"\d+ of \d+ subgroups \(\d", lines[0]), lines[0]
    assert len(limited["warnings"]) == 1, limited["warnings"]
    said = limited["warnings"][0]
    assert re.search(r"\d+ of \d+ subgroups of the optimizer state \(\d+\.\d MiB\)", said), said
    assert "pageable memory" in said and "TIDE_NODE_PINNED_LIMIT" in said, said
    assert pinned["warnings"] == []
    assert limited["digest"] == pinned["digest"]
