"""What ``tide run --optimizer`` installs in a Python program: tide's optimizer in place of
PyTorch's, with no change to the program.

tide's start-up hook (``tide/_startup/sitecustomize.py``) calls ``install_for_tide_run()`` as soon
as the program has imported ``torch``. It

- installs tide's device caching allocator (``tide.torch.use_allocator()``) while CUDA is not yet
  initialised, where PyTorch can use CUDA at all (its build has CUDA and libcuda.so.1 loads; the
  hook does not call ``torch.cuda.is_available()``, which would initialise the driver before the
  program forks its workers);
- replaces ``torch.optim.AdamW`` and ``torch.optim.Adam`` (and the same names in the modules
  ``torch.optim.adamw`` and ``torch.optim.adam``, so ``from torch.optim.adamw import AdamW`` gets
  tide's too) by classes that build ``tide.torch.AdamW`` / ``Adam`` instead;
- says what it did in one line on stderr.

Without a GPU, tide's optimizer runs on CPU tensors over its host stand-in driver
(tide.torch.cpu_mode(); it finds the driver next to libtide.so unless TIDE_CUDA_DRIVER names one).

The replacements (``torch.optim.AdamW`` while tide run is in force) answer the program as
PyTorch's classes do:

- Calling one accepts PyTorch's signature and returns a ``tide.torch.AdamW`` (or ``Adam``).
  ``foreach`` and ``fused`` choose among PyTorch's implementations and mean nothing to tide's;
  ``amsgrad``/``capturable``/``differentiable`` set to False are PyTorch's defaults. What tide's
  optimizer does not implement (``amsgrad=True``, ``capturable=True``, ``differentiable=True``,
  parameters that are sparse, complex, not fp32/bf16/fp16, not contiguous, or not on the device
  kind tide runs on) makes that one optimizer PyTorch's own, with a one-line warning, instead of
  failing; so does a tide optimizer that refuses to be built (RuntimeError, e.g. tide.TideError,
  or ValueError). If PyTorch refuses the call too, the program gets PyTorch's own error, alone,
  and no line.
  ``Adam(..., decoupled_weight_decay=True)``, which is PyTorch's AdamW, builds tide's AdamW.
- ``isinstance``/``issubclass`` give PyTorch's answers, with tide's classes read as the PyTorch
  classes they replace: ``isinstance(opt, torch.optim.AdamW)`` is true for tide's AdamW and for
  PyTorch's (a fallback); ``isinstance(opt, torch.optim.Adam)`` for both Adams and both AdamWs
  (PyTorch's AdamW derives from its Adam), while tide's Adam is no ``torch.optim.AdamW`` (though
  tide's Adam derives from tide's AdamW). tide's classes do not derive from PyTorch's: they share
  none of its implementation, state layout or per-parameter state.
- A class the program derives from ``torch.optim.AdamW``/``Adam`` derives from PyTorch's own
  class: a subclass is written against PyTorch's implementation (its ``step``, ``_init_group``,
  ``state[p]["exp_avg"]``), which tide's optimizer does not have. Its first construction says so
  in one line (once per class; libraries define such classes at import, built or not).
- ``foreach=True``/``fused=True`` choose among PyTorch's implementations: tide's optimizer
  ignores them, says so once, and keeps them in its param groups (and so in checkpoints).

PyTorch's classes stay reachable: ``original("AdamW")`` / ``original("Adam")``, whether or not
tide run replaced them (tide's own comparisons with PyTorch use them).
"""

from __future__ import annotations

import collections.abc
import ctypes
import functools
import inspect
import sys
import threading
from typing import Any

__all__ = ["install_for_tide_run", "installed", "original"]

_NAMES = {"AdamW": "torch.optim.adamw", "Adam": "torch.optim.adam"}  # class -> its torch module
_PREFIX = "tide run --optimizer: "
_SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
_UNSUPPORTED_FLAGS = ("amsgrad", "capturable", "differentiable")

_lock = threading.RLock()
_originals: dict[str, type] = {}  # PyTorch's classes, once install_for_tide_run() replaced them
_replacements: dict[str, type] = {}  # the replacements it put in their place
_meanings: dict[type, type] = {}  # tide's class -> the PyTorch class it replaces
_done = False  # install_for_tide_run() has run (whatever it could do)


def _say(message: str) -> None:
    sys.stderr.write(_PREFIX + message + "\n")
    sys.stderr.flush()


def original(name: str) -> type:
    """PyTorch's own ``torch.optim.<name>`` ("AdamW" or "Adam"), whether or not tide run has
    replaced it in this process."""
    if name not in _NAMES:
        raise ValueError(f"tide run replaces {sorted(_NAMES)}, not {name!r}")
    with _lock:
        if name in _originals:
            return _originals[name]
    import torch.optim

    cls = getattr(torch.optim, name)
    return getattr(cls, "_tide_original", cls)


def installed() -> bool:
    """Whether install_for_tide_run() has replaced PyTorch's Adam/AdamW in this process."""
    return bool(_replacements)


# --- the replacements for torch.optim.AdamW / Adam -------------------------------------------


class _Replacement(type):
    """The metaclass of the replacements: calling one builds tide's optimizer (or PyTorch's, for
    what tide does not support); isinstance/issubclass answer as for PyTorch's class; classes
    derived from a replacement derive from PyTorch's class instead."""

    def __new__(mcls, name, bases, namespace, _tide_replacement=False, **kwargs):
        if _tide_replacement:
            return super().__new__(mcls, name, bases, namespace, **kwargs)
        # A class of the program's (or of a library it imports), derived from
        # torch.optim.AdamW/Adam as tide run installed them.
        rebased = tuple(b._tide_original if isinstance(b, _Replacement) else b
                        for b in bases)
        replacement = next(b for b in bases if isinstance(b, _Replacement))
        meta = type(rebased[0]) if rebased else type
        for base in rebased[1:]:
            if issubclass(type(base), meta):
                meta = type(base)
        cls = meta(name, rebased, namespace, **kwargs)
        _note_at_first_construction(cls, replacement._tide_name)
        return cls

    def __call__(cls, *args, **kwargs):
        return _construct(cls, args, kwargs)

    def __instancecheck__(cls, instance):
        return cls.__subclasscheck__(type(instance))

    def __subclasscheck__(cls, subclass):
        # PyTorch's answer, with tide's classes read as the PyTorch classes they stand for.
        if isinstance(subclass, _Replacement):
            subclass = subclass._tide_original
        for base in getattr(subclass, "__mro__", ()):
            if base in _meanings:
                return issubclass(_meanings[base], cls._tide_original)
        return issubclass(subclass, cls._tide_original)


_noted: set[type] = set()  # classes whose first construction said that they stay PyTorch's


def _note_at_first_construction(cls: type, torch_name: str) -> None:
    """Makes the first construction of `cls` (or of a class derived from it) say, once per class,
    that it keeps PyTorch's optimizer. Libraries define such classes at import (accelerate pulls
    in DeepSpeed's) whether or not the program builds one: only those built are worth a line."""
    own_init = cls.__dict__.get("__init__")
    inherited_init = super(cls, cls).__init__  # what cls's instances run without an own __init__

    @functools.wraps(own_init or inherited_init)
    def __init__(self, *args, **kwargs):
        built = type(self)
        with _lock:
            first = built not in _noted
            _noted.add(built)
        if first:
            _say(f"{built.__qualname__} derives from torch.optim.{torch_name}, so it keeps "
                 f"PyTorch's {torch_name} (a subclass relies on PyTorch's implementation)")
        if own_init is not None:
            own_init(self, *args, **kwargs)
        else:
            super(cls, self).__init__(*args, **kwargs)

    cls.__init__ = __init__


def _replacement(name: str, torch_cls: type, tide_cls: type) -> type:
    namespace = {
        "__module__": torch_cls.__module__,
        "__qualname__": torch_cls.__qualname__,
        "__doc__": (f"torch.optim.{name} under `tide run --optimizer`: builds tide.torch.{name} "
                    f"(PyTorch's: tide.torch.tide_run.original({name!r})).\n\n"
                    + (torch_cls.__doc__ or "")),
        "__signature__": inspect.signature(torch_cls),
        "_tide_name": name,
        "_tide_original": torch_cls,
        "_tide_class": tide_cls,
    }
    return _Replacement(name, (tide_cls,), namespace, _tide_replacement=True)


def _tensors(params: Any):
    """The tensors among an optimizer's params (tensors, (name, tensor) pairs, param groups)."""
    import torch

    for item in params:
        if isinstance(item, dict):
            group = item.get("params", ())
            yield from _tensors([group] if isinstance(group, torch.Tensor) else group)
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor):
            yield item[1]
        elif isinstance(item, torch.Tensor):
            yield item


def _unsupported(arguments: dict[str, Any], torch_signature: inspect.Signature,
                 tide_cls: type) -> list[str]:
    """What tide's optimizer does not implement among the arguments given; drops from
    `arguments` what it does not take and that changes nothing (foreach, fused, PyTorch's
    defaults such as amsgrad=False)."""
    import tide.torch

    named = {p.name for p in inspect.signature(tide_cls).parameters.values()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    reasons = []
    for key in list(arguments):
        value = arguments[key]
        if key == "params":
            continue
        if key in _UNSUPPORTED_FLAGS:
            if value:
                reasons.append(f"{key}=True")
            elif key not in named:
                del arguments[key]
        elif key in named:
            continue
        elif key in ("foreach", "fused"):
            del arguments[key]  # PyTorch's choice among its implementations; tide's is fused
        elif value is torch_signature.parameters[key].default or (
                type(value) is bool and value == torch_signature.parameters[key].default):
            del arguments[key]  # PyTorch's default
        else:
            reasons.append(f"{key}={value!r}")
    device = "cpu" if tide.torch.cpu_mode() else "cuda"
    kinds = set()
    for tensor in _tensors(arguments["params"]):
        dtype = str(tensor.dtype).removeprefix("torch.")
        if tensor.is_sparse:
            kinds.add("sparse parameters")
        elif tensor.is_complex():
            kinds.add("complex parameters")
        elif dtype not in _SUPPORTED_DTYPES:
            kinds.add(f"{dtype} parameters")
        elif tensor.device.type != device:
            kinds.add(f"parameters on {tensor.device.type} (tide's optimizer here: {device})")
        elif not tensor.is_contiguous():
            kinds.add("non-contiguous parameters")
    return reasons + sorted(kinds)


def _construct(replacement: type, args: tuple, kwargs: dict) -> Any:
    """torch.optim.<name>(*args, **kwargs) under tide run: tide's optimizer where it can be."""
    torch_cls = replacement._tide_original
    name = replacement._tide_name
    try:
        bound = replacement.__signature__.bind(*args, **kwargs)
    except TypeError:
        return torch_cls(*args, **kwargs)  # PyTorch's own error for a call it would refuse
    arguments = dict(bound.arguments)  # what the program gave, by name
    # Iterators read once, for tide's or PyTorch's (which would make the same lists).
    if isinstance(arguments["params"], collections.abc.Iterator):
        arguments["params"] = list(arguments["params"])
    for item in arguments["params"] if isinstance(arguments["params"], (list, tuple)) else ():
        if isinstance(item, dict) and isinstance(item.get("params"), collections.abc.Iterator):
            item["params"] = list(item["params"])
    tide_cls = replacement._tide_class
    tide_arguments = dict(arguments)
    if name == "Adam" and tide_arguments.get("decoupled_weight_decay"):
        del tide_arguments["decoupled_weight_decay"]  # PyTorch's AdamW is exactly this Adam
        tide_cls = _replacements["AdamW"]._tide_class
    reasons = _unsupported(tide_arguments, replacement.__signature__, tide_cls)
    call = "torch.optim.{}({})".format(
        name, ", ".join(f"{k}={v!r}" for k, v in arguments.items() if k != "params"))
    if reasons:
        # PyTorch's is built first: if PyTorch refuses the call too, its error alone surfaces.
        fallback = torch_cls(**arguments)
        _say(f"{call}: tide's optimizer does not support {', '.join(reasons)}; "
             f"this optimizer is PyTorch's {name}")
        return fallback
    try:
        optimizer = tide_cls(**tide_arguments)
    except (RuntimeError, ValueError) as error:  # TideError is a RuntimeError
        refusal = str(error)
    else:
        _say_once_about_implementation_flags(name, arguments)
        return optimizer
    # Outside the except clause, so that PyTorch's own error, if it refuses the call too, comes
    # alone (no chained traceback of tide's), and the line is said only for what was built.
    fallback = torch_cls(**arguments)
    _say(f"{call}: tide's optimizer cannot run here ({refusal}); "
         f"this optimizer is PyTorch's {name}")
    return fallback


_flags_said = False


def _say_once_about_implementation_flags(name: str, arguments: dict[str, Any]) -> None:
    """foreach/fused=True pick among PyTorch's implementations: tide's optimizer has its own, and
    keeps the values in its param groups (so that checkpoints move between tide and PyTorch).
    Said once per process."""
    global _flags_said
    flags = [f"{key}=True" for key in ("fused", "foreach") if arguments.get(key)]
    with _lock:
        if not flags or _flags_said:
            return
        _flags_said = True
    _say(f"torch.optim.{name}({', '.join(flags)}): tide's optimizer runs its own fused update "
         "and ignores this choice among PyTorch's implementations; "
         f"{' and '.join(flags)} stay{'s' if len(flags) == 1 else ''} in its param groups and "
         "checkpoints, as PyTorch's would keep it")


# --- the allocator ---------------------------------------------------------------------------


_driver_present: bool | None = None


def _cuda_driver_present() -> bool:
    """Whether libcuda.so.1 loads (loading it starts nothing: no cuInit, no context)."""
    global _driver_present
    if _driver_present is None:
        try:
            ctypes.CDLL("libcuda.so.1")
            _driver_present = True
        except OSError:
            _driver_present = False
    return _driver_present


def _install_allocator() -> str | None:
    """Installs tide's allocator where PyTorch can use CUDA; what it did, or None (no CUDA)."""
    import torch

    from tide.torch import allocator

    if not torch.backends.cuda.is_built() or not _cuda_driver_present():
        return None
    if torch.cuda.is_initialized():
        return "PyTorch's device allocator stays: CUDA was initialised before tide run's hook"
    try:
        allocator.use_allocator()
    except Exception as error:  # noqa: BLE001  (the program runs on, with PyTorch's allocator)
        return f"PyTorch's device allocator stays: {error}"
    return "with tide's device allocator"


# --- the entry point -------------------------------------------------------------------------


def install_for_tide_run() -> None:
    """tide run --optimizer's work in this process, once ``torch`` is imported: tide's allocator
    (before CUDA starts), tide's Adam/AdamW in place of PyTorch's, one line on stderr.
    Calling it again does nothing."""
    global _done
    with _lock:
        if _done:
            return
        _done = True
        try:
            _install()
        except Exception as error:  # noqa: BLE001  (never fail the program's `import torch`)
            _say(f"could not install tide's optimizer ({type(error).__name__}: {error}); "
                 "running the program with PyTorch's")


def _install() -> None:
    import torch
    import torch.optim
    import torch.optim.adam  # noqa: F401
    import torch.optim.adamw  # noqa: F401

    import tide.torch as tide_torch

    tide_classes = {name: getattr(tide_torch, name, None) for name in _NAMES}
    missing = [name for name, cls in tide_classes.items() if cls is None]
    if missing:
        _say(f"tide's PyTorch optimizer is not available yet (tide.torch has no "
             f"{' nor '.join(missing)}); running the program unchanged, with tide's memory "
             "telemetry only")
        return

    torch_classes = {name: getattr(torch.optim, name) for name in _NAMES}
    torch_classes = {n: getattr(c, "_tide_original", c) for n, c in torch_classes.items()}
    allocator_note = _install_allocator()
    for name, module in _NAMES.items():
        replacement = _replacement(name, torch_classes[name], tide_classes[name])
        _meanings[tide_classes[name]] = torch_classes[name]
        _originals[name] = torch_classes[name]
        _replacements[name] = replacement
        setattr(torch.optim, name, replacement)
        setattr(sys.modules[module], name, replacement)
    _say("torch.optim.AdamW and torch.optim.Adam are tide's (tide.torch.AdamW, tide.torch.Adam)"
         + (f", {allocator_note}" if allocator_note else ""))
