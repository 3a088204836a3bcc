"""What one ``image.folder`` batch held, and the same batch made again, bit for bit.

A batch of an image-folder epoch is fixed by the listing alone: batch ``k`` holds the items
at positions ``[k * batch_size, (k + 1) * batch_size)`` of the epoch's order (shuffled by
``(seed, epoch)``, cut to the rank's part), less the rows that failed to decode; each image's
crop and flip come from ``item_random(seed, epoch, sample)`` and the picture's size. So a
journal (``asyncflow/journal/``) needs, per delivered batch, what the assembler saw: its
listing, its number and its failed rows, which the assembler notes on the batch itself
(``BatchAssembler.take_note``); and, because a file can be rewritten in place, what each file
held: :meth:`FolderJournal.journal_entry` reads each kept file once, records a digest of its
bytes and the crop and flip drawn from them (with :func:`~asyncflow.image._decode.
augmentation`, the function the decoder itself uses). :meth:`FolderJournal.journal_rebuild`
reads each file again, refuses one whose digest changed, and decodes the same bytes with the
same key into a new buffer of the batch's type.

The file is read right after the batch is delivered, in the consumer's thread (from the page
cache, where the decoder just left it): about 0.1 ms for the read and digest and 0.15 ms for
the header of a 110 KB JPEG. A file rewritten between its decode and that read is recorded
as rewritten.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from .._blob import read_regular
from .._errors import ConfigError, RebuildWarning, SourceError
from ..pipeline import short_digest
from ._decode import augmentation, decode
from ._geometry import Crop

if TYPE_CHECKING:
    import torch

    from ._listing import Listing
    from ._slots import BatchAssembler  # imports torch: reading a journal does not need it

__all__ = ["FolderJournal", "record_crops"]

KIND = "image.folder"


def record_crops(line: dict[str, Any], config: dict[str, Any]) -> list[Crop | None]:
    """The crops of a journal record's rows: those it holds, or (a record written before they
    were) drawn again from each file (``[path, label, sample]`` under the root) as it is now.

    The journal reads ``image.folder`` records through this: ``asyncflow/__init__.py``
    registers it as the feature ``"journal_crops:image.folder"``, so the journal imports
    nothing of ``asyncflow.image``.
    """
    drawn = line.get("crops")
    if drawn is not None:
        return [None if c is None else Crop((int(c[0]), int(c[1]), int(c[2]), int(c[3])),
                                            bool(c[4])) for c in drawn]
    size = (int(config["size"][0]), int(config["size"][1]))
    return [
        augmentation(os.path.join(config["root"], str(path)), size=size,
                     resize=config["resize"], train=config["train"], seed=config["seed"],
                     epoch=line["epoch"], index=int(sample), max_pixels=config["max_pixels"])
        for path, _, sample, *_ in line.get("items", ())
    ]


class FolderJournal:
    """``image.folder``'s side of the journal (:class:`~asyncflow.journal.Journaled`, with
    ``ImageFolder.journal_begin``): ``ImageFolder`` is one. It reads where the files are, how
    they are cut and decoded, and the assembler that notes which rows each batch held."""

    root: str
    batch_size: int
    _seed: int
    _decode_options: dict[str, Any]
    _listing: Listing
    _assembler: BatchAssembler

    def journal_config(self) -> dict[str, Any]:
        """The run's configuration for a journal: what :func:`record_crops` needs to draw the
        crops again without the pipeline, and what :meth:`journal_rebuild` checks."""
        options = self._decode_options
        return {
            "kind": KIND, "root": self.root, "seed": self._seed,
            "batch_size": self.batch_size, "size": list(options["size"]),
            "train": options["train"], "resize": options["resize"],
            "max_pixels": options["max_pixels"], "normalize": options["normalize"],
            "decoder": options.get("decoder", "cpu"),
        }

    def journal_entry(self, batch: Any, cache: dict[int, Any]) -> dict[str, Any] | None:
        """The journal record of a delivered batch: its epoch and step (batch number), the
        positions and files it holds in row order, and its failed rows; ``None`` when the
        batch is not one the assembler released (a stage after it made a new one).

        ``cache`` keeps the latest epoch's order (one permutation per epoch, not per batch).
        """
        labels = batch[1] if isinstance(batch, tuple) and len(batch) == 2 else None
        noted = self._assembler.take_note(labels)
        if noted is None:
            return None
        made_by: list[Any]
        run, number, failed, absent, *made_by = noted
        listing = self._listing
        epoch = listing.epochs[run]
        if epoch not in cache:
            cache.clear()
            cache[epoch] = np.asarray(listing.order(epoch), dtype=np.int64)
        order = cache[epoch]
        first = number * self.batch_size
        rows = min(self.batch_size, len(order) - first)
        gone = {row for row, _ in failed} | set(absent)  # absent: delivered before a resume
        positions = [first + row for row in range(rows) if row not in gone]
        root = self.root
        prefix = os.path.join(root, "")

        def named(position: int) -> list[Any]:
            path, label = listing.samples[int(order[position])]
            # Under the root as scan() lists them (cheaper than relpath, its fallback).
            path = (path[len(prefix):] if path.startswith(prefix)
                    else os.path.relpath(path, root))
            return [path, label, int(order[position])]

        items = [named(p) for p in positions]
        digests, drawn = self._read_back(epoch, items)
        return {
            "epoch": epoch, "step": number, "positions": positions, "items": items,
            "failed": [[first + row, named(first + row)[0], error] for row, error in failed],
            "digests": digests, "crops": drawn,
            **({"decoder": made_by[0]} if made_by else {}),
        }

    def _read_back(self, epoch: int, items: list[list[Any]]
                   ) -> tuple[list[str | None], list[list[Any] | None]]:
        """Each kept file's digest and the crop and flip drawn from its bytes (``None`` for a
        file that can no longer be read: it changed since it was decoded)."""
        options = self._decode_options
        digests: list[str | None] = []
        drawn: list[list[Any] | None] = []
        for path, _, sample in items:
            full = os.path.join(self.root, path)
            try:
                data = read_regular(full, full, None)
                crop = augmentation(data, name=full, size=options["size"],
                                    resize=options["resize"], train=options["train"],
                                    seed=self._seed, epoch=epoch, index=sample,
                                    max_pixels=options["max_pixels"])
            except (SourceError, ValueError):
                digests.append(None)
                drawn.append(None)
                continue
            digests.append(short_digest(data))
            drawn.append([*crop.box, crop.flip])
        return digests, drawn

    def journal_rebuild(self, config: dict[str, Any], epoch: int,
                        items: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode the batch's kept items again, in its row order, as ``image.folder`` did.

        ``items``: ``[path, label, sample]``, or ``[path, label, sample, digest]`` where the
        journal recorded the file's digest: the file must still hold those bytes.

        Raises:
            ConfigError: This pipeline is not the one the journal recorded (another root,
                seed, size, or type of batch).
            SourceError: A file changed since the run (its digest differs, or it cannot be
                read); the message names it.
            DecodeError: An item that decoded then no longer does (the file changed).
        """
        import torch

        here = self.journal_config()
        differs = [k for k in ("root", "seed", "size", "train", "resize", "normalize")
                   if here[k] != config.get(k)]
        if differs:
            raise ConfigError(
                "this image.folder pipeline is not the one the journal recorded: "
                + ", ".join(f"{k} is {here[k]!r} here, {config.get(k)!r} in the journal"
                            for k in differs))
        options = {k: v for k, v in self._decode_options.items() if k != "decoder"}
        decoder = config.get("decoder", "cpu")
        if decoder != "cpu":
            warnings.warn(
                f"this batch was decoded on the GPU ({decoder}); it is rebuilt on the CPU, "
                "within the GPU path's tolerance of it (2 levels of 255 on average, 4 for the "
                "worst image), not bit for bit", RebuildWarning, stacklevel=3)
        dtype = np.float32 if options["normalize"] else np.uint8
        array = np.empty((len(items), 3, *options["size"]), dtype)
        for row, (path, _, sample, *recorded) in enumerate(items):
            full = os.path.join(self.root, path)
            data = read_regular(full, full, None)
            if recorded and recorded[0] != (digest := short_digest(data)):
                raise SourceError(
                    f"{full}: changed since the run (its bytes' digest is {digest}, "
                    f"the journal recorded {recorded[0]}): the batch cannot be made again")
            decode(data, name=full, out=array[row], layout="chw", seed=self._seed,
                   epoch=epoch, index=sample, **options)
        labels = torch.tensor([label for _, label, _, *_ in items], dtype=torch.int64)
        return torch.from_numpy(array), labels
