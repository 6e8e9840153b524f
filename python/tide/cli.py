"""The `tide` command installed by pip: runs the C++ `tide` executable shipped in the package
(or, in a source checkout, the one in build/bin)."""

from __future__ import annotations

import os
import pathlib
import sys

_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


def executable() -> pathlib.Path:
    for path in (
        _PACKAGE_DIR / "bin" / "tide",
        _PACKAGE_DIR.parent.parent / "build" / "bin" / "tide",
    ):
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise SystemExit(
        "tide: the tide executable is missing from the package (looked in tide/bin and "
        "build/bin); reinstall with `pip install .` or build with `make`"
    )


def main() -> None:
    exe = executable()
    os.execv(exe, [str(exe), *sys.argv[1:]])


if __name__ == "__main__":
    main()
