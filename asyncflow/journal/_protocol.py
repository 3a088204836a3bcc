"""The journal's seam: how a pipeline records its own outputs (``image.folder`` does).

A pipeline that meets :class:`Journaled` tells the journal what each delivered output holds,
instead of the run's lineage: ``image.folder`` records the files, labels, digests and crops of
each batch, and makes a batch again from its record. The journal checks for the protocol
(``isinstance(pipe, Journaled)``); it imports no feature, and no feature reaches into it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Journaled"]


@runtime_checkable
class Journaled(Protocol):
    """A pipeline that journals its own outputs (``ImageFolder`` is one).

    The three methods are called by :class:`~asyncflow.journal.Journal` and
    :func:`~asyncflow.journal.rebuild`, in the consumer's thread.
    """

    def journal_begin(self) -> dict[str, Any] | None:
        """Start noting which output is which, as a journaled run starts.

        Returns:
            The run's configuration, a JSON object with a ``"kind"`` (the records' kind), written
            in the run's header and handed back to :meth:`journal_rebuild`; ``None`` when stages
            after the pipeline's own outputs make new ones (the journal then records no
            positions).
        """

    def journal_entry(self, output: Any, cache: dict[int, Any]) -> dict[str, Any] | None:
        """The record of a delivered output.

        Args:
            output: The output, as the consumer received it.
            cache: A dict the journal keeps for the run, for the pipeline's own use.

        Returns:
            The record's fields (``epoch``, ``step``, ``positions``, ``items``, ``failed``, and
            any of the pipeline's own), or ``None`` for an output the pipeline did not make:
            the journal then records it from the run's lineage.
        """

    def journal_rebuild(self, config: dict[str, Any], epoch: int, items: list[Any]) -> Any:
        """The output of a record made again.

        Args:
            config: The run's configuration, as :meth:`journal_begin` returned it.
            epoch: The record's epoch.
            items: The record's items, each followed by its digest where it has one.

        Raises:
            SourceError: An item's source changed since the run.

        Cancellation:
            Blocks until the output is made: call it from a thread in async code.
        """
