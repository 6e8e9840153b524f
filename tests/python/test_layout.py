"""The folders' include graph points one way (docs/design/layout.md): each folder includes only
the folders below it, and only capi/ sees the public C ABI's types (include/tide/tide.h)."""

import pathlib
import re

import pytest

# What each folder may include besides itself. Lower layers first: config and io depend on
# nothing; the C ABI (capi/) on every domain folder; tools, interpose and the stand-in beside it.
ALLOWED = {
    "config": set(),
    "io": set(),
    "driver": {"config"},
    "kernels": {"config", "driver"},
    "allocator": {"config", "driver", "io"},
    "planner": {"config", "driver", "io", "kernels", "allocator"},
    "runtime": {"config", "driver", "io", "kernels", "allocator", "planner"},
    "capi": {"config", "driver", "io", "kernels", "allocator", "planner", "runtime", "tide"},
    "interpose": {"config", "io", "allocator"},
    "standin": {"config", "kernels"},
    "tools": {"config", "driver", "io", "kernels", "allocator", "planner", "runtime"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/', re.MULTILINE)


def includes(repo: pathlib.Path, folder: str) -> dict[str, set[str]]:
    """The project folders each source file of `folder` includes (other than its own)."""
    found: dict[str, set[str]] = {}
    for path in sorted((repo / folder).rglob("*")):
        if path.suffix in {".h", ".cpp", ".cu", ".c"} and path.is_file():
            targets = {m.group(1) for m in INCLUDE.finditer(path.read_text(errors="replace"))}
            found[str(path.relative_to(repo))] = targets - {folder}
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_a_folder_includes_only_the_folders_below_it(repo, folder):
    wrong = {f"{path} includes {sorted(targets - ALLOWED[folder])}"
             for path, targets in includes(repo, folder).items() if targets - ALLOWED[folder]}
    assert not wrong, "\n".join(sorted(wrong))


def test_every_source_folder_has_a_layer(repo):
    """A new top-level folder of C++ sources must be placed in ALLOWED."""
    sources = {p.parts[0] for suffix in ("*.h", "*.cpp") for p in
               (q.relative_to(repo) for q in repo.glob(f"*/**/{suffix}"))}
    unplaced = sources - set(ALLOWED) - {"tests", "bench", "build", "include", "examples", "docs",
                                         "out", "python", "scripts", "cmake"}
    unplaced = {d for d in unplaced if not d.startswith((".", "build"))}
    assert not unplaced, f"folders with C++ sources and no layer: {sorted(unplaced)}"


def test_the_rule_sees_a_wrong_include(tmp_path):
    """The check itself: a planner file that includes the runtime is caught."""
    (tmp_path / "planner").mkdir()
    (tmp_path / "planner" / "bad.cpp").write_text('#include "runtime/executor.h"\n')
    found = includes(tmp_path, "planner")
    assert found == {"planner/bad.cpp": {"runtime"}}
    assert found["planner/bad.cpp"] - ALLOWED["planner"] == {"runtime"}
