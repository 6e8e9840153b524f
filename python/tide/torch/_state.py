"""opt.state[p] as torch.optim.AdamW keeps it, over tide's pinned state.

torch.optim.AdamW keeps, for each parameter that has had a step, "step" (a float32 scalar
tensor), "exp_avg" and "exp_avg_sq" (shaped like the parameter). Programs read and write them
between steps (loggers, LR finders, state surgery, trainers' resume logic) and expect the next
step to use what they wrote. tide keeps that state in pinned host memory cut into subgroups; an
entry's tensors are CPU tensors over it, plus "master_param" (the fp32 master weights) for a
low-precision parameter, or with bf16 master weights (master_dtype=torch.bfloat16) "master_comp"
(their bf16 compensation; the weights are the parameter itself):

- A parameter inside one subgroup: its tensors are views of the subgroup's pinned buffers (no
  copy). A step may move a subgroup's state to another buffer (the commit point's spare slots,
  executor.h); the memory under the views' storage moves with it (Bucket._follow), so the same
  tensors, and tensors derived from them (t[0], t.view(-1)), stay the live state. On a torch
  without UntypedStorage._swap_data_ptr_ the tensor objects are re-pointed there (Tensor.set_)
  after every step and load instead, and derived tensors stay on the buffer they were made on.
- A parameter across subgroups cannot be one view of one buffer, and bf16 or 8-bit moments
  (state_dtype=torch.bfloat16 or "q8") cannot be fp32 views at all. Such tensors are copies
  (fp32: bf16 moments upcast exactly, 8-bit ones dequantized; a write into one is quantized
  with its blocks when taken), made
  when read through the entry (`entry["exp_avg"]`, get, items, values, copy, repr, pickling),
  written back into the state before the next step (or state_dict) when their version counter
  says they were written. After a step, a copy still referenced outside the entry is refreshed in
  place; any other is let go (its memory freed) and made again when next read. So these copies
  cost memory and time only while a program uses them. A copy that tensors derived from it
  share (t.narrow(...), t.detach(): DeepSpeed's ZeRO 1 and 2 read and write such views, taken
  once after the first step) is kept and refreshed in place too, so those views show the state.
  Writes through `.data` (DeepSpeed's safe_set_*_optimizer_state) escape version counters, so a
  copy read since the last step goes back into the state before the next one whatever its
  counter says (exact: fp32 and bf16 values; 8-bit moments only when the counter moved). A copy
  in use thus costs a gather after each step and a scatter before the next.
- Memory is never freed under a tensor: each view keeps its executor's pinned memory allocated
  (Executor.memory), even after the optimizer is gone.

An entry appears at a parameter's first step with a gradient, as in torch (none before). A
tensor assigned to a key (`opt.state[p]["exp_avg"] = t`, as Lightning's state moves do) is
copied into tide's state at the next step or state_dict(), and the entry takes its own tensor
back. An entry replaced by another dict is loaded (checked as load_state_dict checks it); an
entry removed or emptied starts that parameter's state again, as torch would: zero moments,
master weights from the parameter.

For an FSDP2 parameter (a DTensor) the entry shows DTensors with its placements, as
torch.optim.AdamW keeps there; their local tensors are the tensors above.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Iterable

import torch

from tide.torch import _checkpoint
from tide.torch._bucket import Bucket
from tide.torch._distributed import local, shown

_PINNED = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq", "master_param": "param",
           "master_comp": "comp"}
# The dtype an entry shows, where it is not fp32: the compensation of bf16 master weights is
# bf16 (an fp32 copy would double it, and torch's load_state_dict casts it to the bf16
# parameter's dtype anyway).
_DTYPES = {"master_comp": torch.bfloat16}


def _references(tensors: dict[str, torch.Tensor], key: str) -> int:
    return sys.getrefcount(tensors[key])


def _unheld_references() -> int:
    """What _references counts for a tensor that only its entry holds (its slot in the entry
    and in the entry's own table): measured, since interpreters count their temporaries
    differently."""
    probe = torch.empty(0)
    holders = ({"key": probe}, {"key": probe})
    del probe
    return _references(holders[1], "key")


_UNHELD = _unheld_references()


def _storage_users(tensor: torch.Tensor) -> int:
    # torch's own count of a storage's holders (private, as torch's cudagraph trees use it): the
    # only way to see tensors derived from a copy, which hold its storage, not the tensor.
    # Without it (another torch), every copy counts as shared: kept in step, never wrong.
    count = getattr(torch._C, "_storage_Use_Count", None)
    return count(tensor.untyped_storage()._cdata) if count else sys.maxsize


def _unshared_storage_users() -> int:
    """What _storage_users counts for a tensor no other tensor shares storage with: measured."""
    count = _storage_users(torch.empty(1))
    return count if count < sys.maxsize else 0


_UNSHARED = _unshared_storage_users()


def _shared(tensor: torch.Tensor) -> bool:
    """Whether tensors derived from `tensor` (views) share its storage."""
    return tensor.numel() > 0 and _storage_users(tensor) > _UNSHARED


def _name(bucket: Bucket, i: int) -> str:
    return (f"a parameter of param group {bucket.group_index} (shape "
            f"{tuple(bucket.params[i].shape)})")


class ParamState(dict):
    """One parameter's entry in opt.state (see above)."""

    def __init__(self, bucket: Bucket, index: int, step: float):
        super().__init__(step=torch.tensor(step, dtype=torch.float32))
        self._bucket = bucket
        self._index = index
        keys = bucket.entry_keys
        # Copies, not views: every key of a parameter across subgroups, and moments kept in
        # another dtype than the fp32 that torch shows (state_dtype).
        split = len(bucket.pieces[index]) > 1
        self._copied = {key for key in keys
                        if split or (key in ("exp_avg", "exp_avg_sq")
                                     and bucket.state_dtype != torch.float32)}
        owner = bucket.owners[index]
        # The tensor of each key that tide keeps true, and for an FSDP2 parameter the DTensor
        # over it that the entry shows (_face). Only the DTensor holds a second reference to it
        # (refresh counts them).
        shown_ = {key: shown(owner, torch.empty(0, dtype=_DTYPES.get(key, torch.float32)))
                  for key in keys}
        self._tensors = {key: local(t) for key, t in shown_.items()}
        self._dtensors = {key: t for key, t in shown_.items() if t is not self._tensors[key]}
        del shown_  # refresh counts who holds the tensors: not this frame
        self._stale: set[str] = set()  # copies that do not hold the state as it is now
        self._versions: dict[str, int] = {}  # of each copy when it last matched the state
        # Where a view lies in its subgroup's pinned buffer (subgroup, element offset, shape,
        # strides): fixed for the bucket's life, so each step's _point only compares addresses.
        piece = bucket.pieces[index][0]
        shape = bucket.params[index].shape
        self._view_at = (piece.subgroup, piece.sub_offset, shape,
                         [math.prod(shape[d + 1:]) for d in range(len(shape))])
        self.refresh()

    # ---- what the program sees ----

    def __getitem__(self, key: Any) -> Any:
        self._bucket.ensure_mirror()  # a view shows the pinned buffer: it must be the state
        if key in self._stale:
            self._copy_in(key)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def items(self) -> Any:
        self._copy_all_in()
        return dict.items(self)

    def values(self) -> Any:
        self._copy_all_in()
        return dict.values(self)

    def __iter__(self) -> Any:
        # Defined so that dict(entry), {**entry} and update() read through __getitem__.
        return dict.__iter__(self)

    def copy(self) -> dict[Any, Any]:
        return dict(self.items())

    def pop(self, key: Any, *default: Any) -> Any:
        self._bucket.ensure_mirror()
        if key in self._stale:
            self._copy_in(key)
        return dict.pop(self, key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else dict.setdefault(self, key, default)

    def __repr__(self) -> str:
        self._copy_all_in()
        return dict.__repr__(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickled and copied as the plain dict torch.optim keeps.
        return dict, (dict(self.items()),)

    # ---- keeping it true to tide's state ----

    def _copy_in(self, key: str) -> None:
        """A copy of the state into `key`'s tensor (a parameter across subgroups)."""
        tensor = self._tensors[key]
        if tensor.numel() == self._bucket.params[self._index].numel():
            self._bucket.gather(self._index, _PINNED[key], out=tensor)
        else:
            tensor.set_(self._bucket.gather(self._index, _PINNED[key]))
        self._versions[key] = self._version(key)
        self._stale.discard(key)

    def _face(self, key: str) -> torch.Tensor:
        """What the entry shows for `key`: its tensor, or the DTensor over it."""
        return self._dtensors.get(key, self._tensors[key])

    def _version(self, key: str) -> tuple[int, int]:
        """Writes into `key`'s copy count here (a DTensor's in-place ops count on the DTensor)."""
        return (self._face(key)._version, self._tensors[key]._version)

    def _exact(self, key: str) -> bool:
        """Whether `key`'s copy goes back into the state bit for bit (all but 8-bit moments)."""
        return key not in ("exp_avg", "exp_avg_sq") or not self._bucket.quantized

    def _copy_all_in(self) -> None:
        self._bucket.ensure_mirror()
        for key in list(self._stale):
            self._copy_in(key)

    def _point(self, key: str) -> None:
        """`key`'s tensor on the subgroup's pinned buffer where the state is now."""
        subgroup, offset, shape, strides = self._view_at
        base = self._bucket.views[subgroup][_PINNED[key]]
        tensor = self._tensors[key]
        if (tensor.data_ptr() != base.data_ptr() + base.element_size() * offset
                or tensor.shape != shape):
            tensor.set_(base.untyped_storage(), offset, shape, strides)

    def refresh(self) -> None:
        """After the state changed (a step, a load): the entry's tensors show it. Discards what
        was assigned to its keys and not yet taken (take_writes)."""
        tensors = self._tensors
        for key in tensors:
            dict.__setitem__(self, key, self._face(key))
        bucket = self._bucket
        for key in tensors:  # no local name may hold a tensor here: it would count
            if key not in self._copied:
                self._point(key)
                # The program holds the view: it shows the state (a mirror to make current only
                # while subgroups are resident).
                if bucket.mirror_stale and _references(tensors, key) > _UNHELD:
                    bucket.ensure_mirror()
            elif _references(tensors, key) > _UNHELD or _shared(tensors[key]):
                self._copy_in(key)  # the program holds it or a view of it: it shows the state
            else:
                self._tensors[key].set_()  # let the copy go; made again when read
                self._stale.add(key)

    def check_writes(self) -> bool:
        """Raises ValueError (naming the parameter) for a value assigned to a key that tide's
        state cannot take. Returns whether take_writes has anything to take: a value assigned,
        a step count that is not a tensor, or a copy the program may have written (an entry
        of views only, untouched, has none; most entries, most steps)."""
        step = dict.get(self, "step")
        number = isinstance(step, (int, float)) and not isinstance(step, bool)
        if not (number or step is None or isinstance(step, torch.Tensor) and step.numel() == 1):
            raise ValueError(f"tide: opt.state of {_name(self._bucket, self._index)}: 'step' "
                             f"must be a number or a 1-element tensor, got {step!r}")
        pending = type(step) is not torch.Tensor or bool(self._copied - self._stale)
        shape = self._bucket.params[self._index].shape
        for key in self._tensors:
            value = dict.get(self, key)
            if value is self._face(key):
                continue
            pending = True
            if value is None:
                continue
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                problem = f"must be a floating-point tensor, got {type(value).__name__}"
            elif local(value).shape != shape:
                problem = f"has shape {tuple(value.shape)}, the parameter {tuple(shape)}"
            else:
                continue
            raise ValueError(f"tide: opt.state of {_name(self._bucket, self._index)}: {key!r} "
                             f"{problem}")
        return pending

    def take_writes(self) -> None:
        """What the program wrote into the entry since the last step becomes tide's state:
        values assigned to its keys, and writes into its copies. (Writes into views are there
        already.) check_writes first."""
        for key, mine in self._tensors.items():
            value = dict.get(self, key)
            if value is not self._face(key):
                value = local(value)  # a DTensor of the parameter's placements: this shard
                if value is not None:
                    if key in self._copied:
                        self._bucket.scatter(self._index, _PINNED[key], value.float().cpu())
                        self._stale.add(key)
                    else:
                        mine.copy_(value)
                dict.__setitem__(self, key, self._face(key))
            elif (key in self._copied and key not in self._stale
                  and (self._version(key) != self._versions[key] or self._exact(key))):
                self._bucket.scatter(self._index, _PINNED[key], mine)
                self._versions[key] = self._version(key)
        step = dict.get(self, "step")
        if not isinstance(step, torch.Tensor):
            dict.__setitem__(self, "step", torch.tensor(float(step or 0), dtype=torch.float32))

    def step_tensor(self) -> torch.Tensor:
        """The tensor holding the parameter's step count (take_writes made it one)."""
        return dict.__getitem__(self, "step")

    def set_step(self, step: int) -> None:
        dict.__getitem__(self, "step").fill_(float(step))


class StateEntries:
    """The entries tide put in an optimizer's opt.state (`state`, torch's defaultdict), and what
    keeps them and tide's state one."""

    def __init__(self):
        self._entries: dict[int, ParamState] = {}  # id(parameter) -> its entry

    def get(self, p: torch.Tensor) -> ParamState | None:
        return self._entries.get(id(p))

    def advance(self, state: dict, bucket: Bucket, indices: Iterable[int]) -> None:
        """The parameters `indices` of `bucket` have had a step: their entries (made at their
        first) count it, in place, as torch.optim counts."""
        steps = []
        for i in indices:
            p = bucket.owners[i]
            entry = self._entries.get(id(p))
            if entry is None:
                entry = self._entries[id(p)] = ParamState(bucket, i, 0.0)
                state[p] = entry
            steps.append(entry.step_tensor())
        # One call for the plain tensors tide made (a per-tensor add_ costs microseconds each);
        # a tensor the program put there (a DTensor, another device) on its own.
        plain, own = [], []
        for t in steps:
            (plain if type(t) is torch.Tensor and t.device.type == "cpu" else own).append(t)
        if plain:
            torch._foreach_add_(plain, 1)
        for t in own:
            t.add_(1)

    def set_step(self, state: dict, bucket: Bucket, i: int, step: int) -> None:
        """Parameter i of `bucket` holds the state of `step` steps (a load): its entry shows it;
        none at step 0, as in torch before the first step."""
        p = bucket.owners[i]
        entry = self._entries.get(id(p))
        if step == 0:
            if entry is not None:
                del self._entries[id(p)]
                if state.get(p) is entry:
                    del state[p]
            return
        if entry is None:
            entry = self._entries[id(p)] = ParamState(bucket, i, float(step))
        else:
            entry.set_step(step)
            entry.refresh()
        state[p] = entry

    def refresh(self) -> None:
        """After a step: every entry shows the state as it is now."""
        for entry in self._entries.values():
            entry.refresh()
        self._mirror_held_views()

    def _mirror_held_views(self) -> None:
        """With resident subgroups (the pinned buffers a mirror after the step): a tensor the
        program derived from an entry's view (t[0], t.view(-1), a DeepSpeed narrow view) holds
        the subgroup's storage, as only the entries' own tensors and tide's view should; then it
        must show the state, and the mirror is made current."""
        viewers: dict[tuple[int, int, str], int] = {}
        buckets: dict[int, Bucket] = {}
        for entry in self._entries.values():
            bucket = entry._bucket
            if not bucket.mirror_stale:
                continue
            buckets[id(bucket)] = bucket
            subgroup = bucket.pieces[entry._index][0].subgroup
            for key in entry._tensors:
                if key not in entry._copied:
                    at = (id(bucket), subgroup, _PINNED[key])
                    viewers[at] = viewers.get(at, 0) + 1
        for (bucket_id, subgroup, key), count in viewers.items():
            bucket = buckets[bucket_id]
            if not bucket.mirror_stale:
                continue
            view = bucket.views[subgroup][key]
            if _storage_users(view) > _UNSHARED + count:
                bucket.ensure_mirror()

    def take_writes(self, state: dict, buckets: list[Bucket],
                    load: Callable[[Bucket, int, int, dict], None]) -> None:
        """Before a step or a state_dict(): what the program did to opt.state since the last
        step becomes tide's state (see above); an entry replaced or removed is loaded with
        `load(bucket, i, step, entry)` (an empty one: step 0). Everything is checked first: a
        value tide cannot take raises ValueError, and then nothing was taken."""
        actions = []
        for bucket in buckets:
            for i, p in enumerate(bucket.owners):
                ours = self._entries.get(id(p))
                current = state.get(p)
                if ours is not None and current is ours:
                    if ours.check_writes():
                        actions.append(ours.take_writes)
                elif ours is not None or current:
                    entry = {} if current is None else current
                    try:
                        step = _checkpoint.checked_entry(entry, p, _name(bucket, i),
                                                         bucket.state_dtype)
                    except ValueError as error:
                        raise ValueError(f"{error} (opt.state[p], as the program replaced "
                                         "it)") from None
                    actions.append(lambda b=bucket, i=i, s=step, e=entry: load(b, i, s, e))
        for action in actions:
            action()
        for bucket in buckets:
            bucket.flush()  # 8-bit moments written above: quantized, once
