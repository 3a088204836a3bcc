"""Ranks: how a job's processes share the data, and how a share resumes on another world size.

Layout, bottom first (each module imports only those above it in this list, the engine's
public face and the error tree)::

    _world.py    this process's rank and world size (torch.distributed, or $RANK/$WORLD_SIZE)
    _cut.py      cut(): the one rule that cuts a list of n items into parts
    _dealt.py    one iteration of a share, each item keyed by its list position for seeding
    _elastic.py  elastic resume: every rank's saved states read back as the items left
    _split.py    Split, Part, Share: this process's share of a list, fresh or resumed

Users meet these as ``asyncflow.Split`` and ``asyncflow.sources.Split`` / ``Share`` /
``Part``; the library's other packages (sources, image, torch, the journal) import them from
here. Nothing here imports torch: ``torch.distributed`` is read only when the program has
imported it.
"""

from __future__ import annotations

from ._cut import cut, padding, part_size
from ._elastic import remaining, settled_of, untouched_state
from ._split import Part, Share, Split
from ._world import world

__all__ = [
    "Part",
    "Share",
    "Split",
    "cut",
    "padding",
    "part_size",
    "remaining",
    "settled_of",
    "untouched_state",
    "world",
]
