"""The source of an ``image.folder`` pipeline: each run lists one epoch, in groups.

Each item carries its epoch and position in the epoch's order, which fix its training crop and
the batch row it is decoded into (see ``_slots.py``), and the number of its listing, which keeps
the buffers of concurrent runs apart. The epoch is the run's (``current_epoch()``): the listing
counts no epochs of its own.

What a listing *is*, for a resume state and a cache's fingerprint: the files by their path
under the tree's root, their labels, sizes and a fingerprint of their bytes
(:meth:`Listing.listing_identity`, :meth:`Listing.describe`); never how many epochs it listed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from ..pipeline import ItemGroup, current_epoch, listing_identity
from ..pipeline.seeding import epoch_rng
from ..ranks import Part
from ._digests import file_tokens, relative_names

__all__ = ["Listing", "Sample"]


class Sample(NamedTuple):
    """One item of an epoch's listing (its repr names the file, for failure reports)."""

    path: str
    label: int
    epoch: int
    pos: int  # position in this epoch's order: fixes the batch row
    run: int  # which listing (one per run): keeps concurrent runs' buffers apart
    sample: int  # index in ``samples``: with the seed and epoch, fixes the training crop


class Listing:
    """The pipeline's source: each call lists one epoch (shuffled by seed and epoch), in
    groups of ``group`` samples: a decoder takes a group at a time, so that it goes back to
    the run's loop for more work once per group rather than once per image.

    With a ``part`` (``image.folder(split=...)``), every rank draws the same epoch order
    (same seed), then takes its positions of it (``Part.positions``): padding repeats the
    start of that order, so a repeated image is one of the epoch's first."""

    def __init__(
        self, samples: list[tuple[str, int]], shuffle: bool, seed: int, group: int,
        part: Part | None = None,
    ) -> None:
        self.samples = samples
        self.shuffle = shuffle
        self.seed = seed
        self.group = group
        self.part = part
        self._lock = threading.Lock()
        self._runs = 0
        #: The epoch of each listing (run) made so far, for a journal.
        self.epochs: dict[int, int] = {}
        self._identity: dict[str, Any] | None = None

    def describe(self) -> dict[str, Any]:
        """What this listing's batches are made of, for a cache's fingerprint: the files and
        labels, the shuffle, the seed and the rank's part; not the epochs listed so far."""
        return {"samples": self.samples, "shuffle": self.shuffle, "seed": self.seed,
                "part": self.part}

    def listing_identity(self) -> dict[str, Any]:
        """What a resume state must find again (``asyncflow/_identity.py``): each
        file by its path under the tree's root and its label, then its size and a fingerprint
        of its first and last bytes (``_digests.py`` says why those). The same tree
        moved to another root is the same listing. Taken once per listing, on first use.

        Cancellation:
            Blocks while it reads the files' ends (threads); once taken, returns at once.
        """
        identity = self._identity
        if identity is None:  # outside the lock: a run listing its epoch does not wait
            paths = [path for path, _ in self.samples]
            names = [f"{name} {label}" for name, (_, label)
                     in zip(relative_names(paths), self.samples, strict=True)]
            identity = self._identity = listing_identity(names, file_tokens(paths))
        return identity

    def count(self) -> int:
        """Images per epoch: this part's share, or every sample."""
        n = len(self.samples)
        return n if self.part is None else self.part.size(n)

    def __call__(self) -> Iterator[ItemGroup]:
        """List the epoch of the run that calls (its pipeline's count, which
        ``set_epoch`` and ``load_state_dict`` set; a merge branch's: the era it
        reads); epoch 0 when called outside a run."""
        epoch = current_epoch()
        epoch = 0 if epoch is None else epoch
        with self._lock:
            run, self._runs = self._runs, self._runs + 1
            self.epochs[run] = epoch
        return self._items(epoch, run)

    def order(self, epoch: int) -> Any:
        """The indices into ``samples`` of epoch ``epoch``'s positions, in order."""
        order: Any = range(len(self.samples))
        if self.shuffle:
            order = epoch_rng(self.seed, epoch).permutation(len(self.samples))
        if self.part is not None:
            order = np.asarray(order, dtype=np.int64)[self.part.positions(len(self.samples))]
        return order

    def _items(self, epoch: int, run: int) -> Iterator[ItemGroup]:
        items = (Sample(*self.samples[int(i)], epoch, pos, run, int(i))
                 for pos, i in enumerate(self.order(epoch)))
        # Groups of ``group`` samples: stats count the images in them, not the groups.
        while group := ItemGroup(itertools.islice(items, self.group)):
            yield group
