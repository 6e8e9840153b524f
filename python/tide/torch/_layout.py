"""How a bucket's parameters are cut into subgroups.

The parameters are laid end to end, flattened, in their param group's order, and cut every
`subgroup_size` elements; a parameter may straddle subgroups. Each (parameter, subgroup) overlap
is a Piece: one tide_param_slice for the executor and one gradient offload call per backward.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Piece:
    subgroup: int
    sub_offset: int    # first element within the subgroup
    param_offset: int  # first element within the flattened parameter
    count: int


def split(numels: list[int], subgroup_size: int) -> tuple[list[int], list[list[Piece]]]:
    """(elements of each subgroup, the pieces of each parameter)."""
    if subgroup_size < 1:
        raise ValueError(f"subgroup_size must be at least 1, got {subgroup_size}")
    sizes: list[int] = []
    pieces: list[list[Piece]] = []
    used = subgroup_size  # elements used in the last subgroup: start a new one at once
    for numel in numels:
        mine = []
        done = 0
        while done < numel:
            if used == subgroup_size:
                sizes.append(0)
                used = 0
            count = min(numel - done, subgroup_size - used)
            mine.append(Piece(len(sizes) - 1, used, done, count))
            sizes[-1] += count
            used += count
            done += count
        pieces.append(mine)
    return sizes, pieces
