"""Group ranks by identical stacks and name the collective (if any) each rank is inside."""

from __future__ import annotations

from dataclasses import dataclass

from diag.stacks.dump import Frame, RankStack

# files whose public functions are collectives; innermost match wins (c10d under deepspeed.comm)
COLLECTIVE_FILES = (
    "torch/distributed/distributed_c10d.py",
    "deepspeed/comm/comm.py",
    "deepspeed/comm/torch.py",
)
WRAPPERS = {"wrapper", "inner", "log_wrapper", "_fn"}


@dataclass
class Group:
    ranks: list[RankStack]
    frames: list[Frame]

    @property
    def labels(self) -> str:
        return ", ".join(r.label for r in self.ranks)


def cluster(stacks: list[RankStack]) -> list[Group]:
    """Identical main-thread stacks together, the biggest group first."""
    groups: dict[tuple[Frame, ...], list[RankStack]] = {}
    for st in stacks:
        groups.setdefault(tuple(st.frames), []).append(st)
    out = [Group(members, list(key)) for key, members in groups.items()]
    return sorted(out, key=lambda g: (-len(g.ranks), g.ranks[0].rank or 0))


def odd_ones_out(groups: list[Group]) -> list[RankStack]:
    """Ranks outside the single largest group, when there is a strict majority to differ from."""
    if len(groups) < 2 or len(groups[0].ranks) == len(groups[1].ranks):
        return []
    return [r for g in groups[1:] for r in g.ranks]


def collective_of(frames: list[Frame]) -> str | None:
    """The collective a stack is inside (e.g. `all_reduce`), from the innermost library frame."""
    for fr in frames:
        if fr.file.endswith(COLLECTIVE_FILES) and not fr.name.startswith("_") and fr.name not in WRAPPERS:
            return fr.name
    return None


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame outside the Python stdlib and site-packages: where the job's code is."""
    for fr in frames:
        if "site-packages" not in fr.file and "/lib/python3" not in fr.file:
            return fr
    return frames[0] if frames else None
