"""A merge branch that ends its own stream: :data:`END_OF_STREAM` (or an :class:`EndOfStream`
with a value) among its items is where the branch ends, as if it had run out.

The branch's last stage returns it (only the merge reads it: an earlier stage would get it as
an item) where the branch's source cannot know the stream has ended: a map whose
worker's own iterator ran out (an ``IterableDataset``'s worker), while the source goes on
handing it tasks. The merge (``_merge.py``) drops the marker and whatever the branch put out
after it, stops the branch's stages, hands the marker's ``value`` to ``Merge.on_end``, and
asks the policy (``ended``). What the stages let in after the end is not counted
(:func:`count_to_end`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._stats import StageCounters

__all__ = ["END_OF_STREAM", "EndOfStream", "count_to_end"]


class EndOfStream:
    """The item that ends its merge branch's stream.

    Args:
        value: What the branch says as it ends (``Merge.on_end`` gets it): the state of an
            iterator that ran out, say. It crosses to and from worker processes pickled.
    """

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def __reduce__(self) -> Any:
        if self is END_OF_STREAM:
            return "END_OF_STREAM"  # the one object in every process
        return (EndOfStream, (self.value,))

    def __repr__(self) -> str:
        return "END_OF_STREAM" if self is END_OF_STREAM else f"EndOfStream({self.value!r})"


#: The item that ends a merge branch's stream, saying nothing more.
END_OF_STREAM = EndOfStream()


def count_to_end(stages: Sequence[StageCounters], counts: Sequence[tuple[int, int, int]] | None,
                 received: int) -> None:
    """Each stage of a branch that ended its stream counts only the items before the end:
    the ``received`` the merge took, plus those failed within a budget on the way; not the
    marker nor what the stages let in after it.

    Args:
        stages: The counters of the branch's stages.
        counts: Each stage's ``(items in, items out, failures)`` as the branch began (a
            restarted branch counts on), or ``None`` where the stages do not keep items one
            for one: then their counts are left as they are.
        received: The branch's items the merge took before the end.
    """
    if counts is None:
        return
    out = received
    for c, (was_in, was_out, was_failed) in zip(reversed(stages), reversed(counts), strict=True):
        c.items_out = min(c.items_out, was_out + out)
        out += c.failures - was_failed
        c.items_in = min(c.items_in, was_in + out)
