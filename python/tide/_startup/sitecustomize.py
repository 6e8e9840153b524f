"""tide's Python start-up hook for ``tide run --optimizer``.

``tide run --optimizer`` puts this directory first on PYTHONPATH, so Python's ``site`` module
imports this file as ``sitecustomize`` at start-up. It

1. runs the ``sitecustomize`` the program would have had without tide (the next one on
   ``sys.path``), under that name, so chaining changes nothing for it;
2. arranges for tide's optimizer to be installed as soon as the program imports ``torch``: the
   allocator before CUDA starts, and ``torch.optim.Adam``/``AdamW`` replaced by tide's. The hook
   waits for the program's own ``import torch`` instead of importing torch itself, so programs
   that never use torch (helpers, launchers) start as fast as without tide.

The contract with tide's PyTorch layer: ``tide.torch.install_for_tide_run()`` does step 2's
work. Until that exists, the hook says so in one line (when the program imports torch, or at
once if there is no tide.torch at all) and the program runs unchanged.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_INSTALL = "install_for_tide_run"
_NOT_AVAILABLE = (
    "tide run --optimizer: tide's PyTorch optimizer is not available yet ({why}); "
    "running the program unchanged, with tide's memory telemetry only"
)


def _say(message):
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _chain_user_sitecustomize():
    """Runs the next ``sitecustomize`` on sys.path (not this one), as ``sitecustomize``."""
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    ours = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        # As if site.py had imported it: the error is the user's, reported by site.py.
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        raise


def _install_optimizer():
    try:
        from tide import torch as tide_torch  # noqa: F401  (imports torch: only after the program did)
    except ImportError as error:
        _say(_NOT_AVAILABLE.format(why=f"tide.torch: {error}"))
        return
    install = getattr(tide_torch, _INSTALL, None)
    if install is None:
        _say(_NOT_AVAILABLE.format(why=f"tide.torch has no {_INSTALL}()"))
        return
    install()


class _AfterTorchImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torch`` through the other finders and runs tide's install once it is imported."""

    def __init__(self):
        self._loader = None

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)  # once: torch's own submodules import normally
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        _install_optimizer()


def _has_tide_torch():
    """Whether tide.torch exists, found without importing it (it may import torch)."""
    spec = importlib.util.find_spec("tide")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if os.path.isfile(os.path.join(location, "torch", "__init__.py")):
            return True
    return False


def _arrange_install():
    if not _has_tide_torch():
        _say(_NOT_AVAILABLE.format(why="no tide.torch package"))
        return
    # Whether tide.torch has the optimizer is known once it can be imported: with torch.
    if "torch" in sys.modules:
        _install_optimizer()
    else:
        sys.meta_path.insert(0, _AfterTorchImport())


try:
    _chain_user_sitecustomize()
finally:
    _arrange_install()
