"""Elastic resume: the states a job saved on W ranks, read back as the epoch's items left.

A pipeline whose source is a :class:`~asyncflow.Share` (``Split()(items)``) saves, in its
state, the share's part (``split``: part index and count, the list's length and a hash of it,
``remainder``, ``shuffle``, ``seed``, the epoch). Its settled positions are local to that
part; :func:`remaining` maps every rank's to *ordinals* of the epoch's order (position ``k``
of the list as shuffled for the epoch, or as given), joins them, and says which ordinals are
left. ``Split.resume`` cuts those left between the new ranks by the same rule as a fresh
list (:func:`~asyncflow.cut` over the items left). A share resumed so saves the jobs before
it compactly (``history``: each job's parts' settled local positions, from which the settled
ordinals are replayed), so that its own state maps back to the same ordinals: a job may
change its world size any number of times within an epoch.

Padding: a repeat that ``"pad"`` added is not an item of its own. Delivering it settles
nothing, and the original is settled only by the part that holds it unpadded. ``"drop"``:
the tail a cut leaves out counts as settled (done for this epoch), so a resume cuts and
drops again among the items left only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._errors import ConfigError, check_int
from ..pipeline import Span, sequence_identity, short_digest, state_checksum
from ._cut import cut, part_size

__all__ = [
    "Partial", "Remaining", "listing_hash", "remaining", "resumed_ordinals", "settled_of",
    "untouched_state",
]

Partial = Literal["refuse", "repeat"]
_SAMPLED = 64  # items of a list hashed by states saved before every item was
#: What every rank's ``split`` must agree on, in the order a difference is reported.
_AGREED = ("n", "listing", "remainder", "shuffle", "seed", "epoch", "count", "history")


def listing_hash(items: Sequence[Any]) -> str:
    """A hash of every item of ``items`` (``sequence_identity``'s digest): the list changed,
    wherever it changed."""
    digest: str = sequence_identity(items)["digest"]
    return digest


def _sampled_hash(items: Sequence[Any]) -> str:
    """The hash states saved before every item was hashed hold: the length and a sample."""
    n = len(items)
    step = max(1, n // _SAMPLED)
    sample = "\n".join([str(n), *(repr(items[i])[:200] for i in range(0, n, step))])
    return short_digest(sample.encode())


def resumed_ordinals(n: int, settled: Span | None, index: int, count: int,
                     remainder: str) -> list[int]:
    """The ordinals (of ``n``) that part ``index`` of ``count`` takes, in order, when the
    ones in ``settled`` are done (``None``: none are): :func:`~asyncflow.cut` over those left.
    A ``"pad"`` repeat is the ordinal it repeats."""
    left = range(n) if settled is None else _left(n, settled)
    taken = cut(len(left), index, count, remainder="pad" if remainder == "pad" else "drop")
    return taken if settled is None else [left[j] for j in taken]


def _left(n: int, settled: Span) -> list[int]:
    return [k for low, high in settled.gaps(0, n) for k in range(low, high)]


@dataclass(frozen=True)
class Remaining:
    """What a job's states left of an epoch: :func:`remaining`'s answer.

    Attributes:
        n: The list's length.
        listing: :func:`listing_hash` of the list.
        remainder: ``"pad"`` or ``"drop"``, as the saving split had it.
        shuffle: Whether the epoch's order was shuffled.
        seed: The shuffle's seed.
        epoch: The epoch the states were taken in.
        settled: The ordinals of the epoch's order that are done: delivered, settled
            otherwise (filtered, failed within a budget), or dropped by ``"drop"``.
        history: How ``settled`` was reached, compactly (what a resumed share saves): one
            entry per job that ran in the epoch, ``{"count", "remainder", "positions"}``
            with each part's settled local positions, by part.
    """

    n: int
    listing: str
    remainder: str
    shuffle: bool
    seed: int
    epoch: int
    settled: Span
    history: list[dict[str, Any]]

    def left(self) -> list[int]:
        """The ordinals not settled, in order."""
        return _left(self.n, self.settled)

    def check(self, listed: Sequence[Any], **split: Any) -> None:
        """Refuse a list or a split's options (``remainder``, ``shuffle``, ``seed``) that
        are not the states'.

        Raises:
            ConfigError: One differs (the message says which).
        """
        if len(listed) != self.n or self.listing not in (listing_hash(listed),
                                                         _sampled_hash(listed)):
            raise ConfigError(
                f"the states were taken over another list ({self.n} items, hash "
                f"{self.listing}), not these {len(listed)} (hash {listing_hash(listed)})"
            )
        for key, here in split.items():
            if here != getattr(self, key):
                raise ConfigError(
                    f"this Split's {key} is {here!r}, the states' {getattr(self, key)!r}"
                )


def _split_of(index: int, state: Any) -> dict[str, Any]:
    if not isinstance(state, Mapping):
        raise ConfigError(f"state {index} is not a pipeline state: {type(state).__name__}")
    body = {k: v for k, v in state.items() if k != "check"}
    if state.get("check") != state_checksum(body):
        raise ConfigError(f"state {index} was edited or damaged: its checksum does not match")
    split = state.get("split")
    if not isinstance(split, Mapping):
        raise ConfigError(
            f"state {index} has no 'split': it was not taken from a pipeline whose source is "
            "a Split share (Split()(items)), or by an asyncflow without elastic resume"
        )
    keys = {"index", "count", "rank", "world_size", *_AGREED}
    missing = keys - set(split)
    if missing:
        raise ConfigError(f"state {index}'s split lacks {sorted(missing)}")
    for key in ("index", "count", "n", "epoch", "seed", "rank", "world_size"):
        check_int(f"state {index}'s split: {key}", split[key], None if key == "seed" else 0)
    if split["count"] < 1 or split["index"] >= split["count"]:
        raise ConfigError(f"state {index}'s split: part {split['index']} of {split['count']}")
    if split["world_size"] < 1 or split["count"] % split["world_size"] or (
        split["rank"] >= split["world_size"]
    ):  # count is world_size * workers a rank
        raise ConfigError(f"state {index}'s split: rank {split['rank']} of world size "
                          f"{split['world_size']}, {split['count']} parts")
    if split["remainder"] not in ("pad", "drop"):
        raise ConfigError(f"state {index}'s split: remainder {split['remainder']!r}")
    return dict(split)


def untouched_state(sibling: Any, index: int) -> dict[str, Any]:
    """The state of part ``index`` of the job that ``sibling`` (another part's state) is
    from, had that part settled nothing: a DataLoader worker that delivered no batch before
    the save, so that its pipeline's state never reached the loader's.

    Raises:
        ConfigError: ``sibling`` is not a ``Split`` share's pipeline state, or ``index`` is
            not one of its job's parts.
    """
    split = _split_of(0, sibling)
    if not 0 <= index < split["count"]:
        raise ConfigError(f"part {index} is outside [0, {split['count'] - 1}]")
    per_rank = split["count"] // split["world_size"]
    body = {"positions": {"mark": 0, "ranges": []},
            "split": {**split, "index": index, "rank": index // per_rank}}
    return {**body, "check": state_checksum(body)}


def _agree(splits: list[dict[str, Any]]) -> None:
    first = splits[0]
    for split in splits[1:]:
        for key in _AGREED:
            if split[key] != first[key]:
                what = "earlier resumes (history)" if key == "history" else key
                raise ConfigError(
                    f"the states are not from one job's epoch: their {what} differs "
                    f"(rank {first['rank']}'s state: {first[key]!r:.60}, rank "
                    f"{split['rank']}'s: {split[key]!r:.60})"
                )
    parts: dict[int, dict[str, Any]] = {}
    for split in splits:
        if split["index"] in parts:
            raise ConfigError(
                f"two states for part {split['index']} (rank {split['rank']}): each rank's "
                "state must be given once"
            )
        parts[split["index"]] = split
    absent = sorted(set(range(first["count"])) - set(parts))
    if absent:
        raise ConfigError(
            f"no state for part(s) {absent} of {first['count']} (world size "
            f"{first['world_size']}): every rank's state is needed, or its items are lost"
        )


def _check_partial(states: Sequence[Any], splits: list[dict[str, Any]]) -> None:
    for state, split in zip(states, splits, strict=True):
        nodes = state.get("nodes") or {}
        if not isinstance(nodes, Mapping):
            raise ConfigError(f"rank {split['rank']}'s state: nodes must be a dict")
        partial = [name for name, extra in nodes.items()
                   if isinstance(extra, Mapping) and any(extra.values())]
        if partial:
            raise ConfigError(
                f"rank {split['rank']}'s state has source items whose outputs were delivered "
                f"in part (stage {partial[0]!r}): a resume on other ranks would read them "
                "again whole; pass partial='repeat' to accept those repeats"
            )


def remaining(states: Sequence[Any], *, partial: Partial = "refuse") -> Remaining:
    """What the states of every rank of a job, taken in one epoch, left of it.

    Args:
        states: Each rank's ``pipe.state_dict()`` (through JSON or not), one per part, in any
            order; the pipelines' sources are ``Split`` shares of the same list.
        partial: What to do with a source item whose outputs a ``flat_map`` or ``unbatch``
            delivered in part (a tar shard read half-way): ``"refuse"`` (a
            ``ConfigError``), or ``"repeat"``: it is not settled, so it is read again whole
            on its new rank, repeating the outputs delivered before.

    Raises:
        ConfigError: No states; a state not from a ``Split`` share's pipeline, or damaged;
            states from different lists, epochs, seeds, world sizes or remainders (the
            message says what differs); a part's state missing or given twice; with
            ``partial="refuse"``, a source item delivered in part.
    """
    if isinstance(states, Mapping) or not isinstance(states, Sequence) or not states:
        raise ConfigError("remaining() takes a non-empty list of every rank's state")
    if partial not in ("refuse", "repeat"):
        raise ConfigError(f"partial must be 'refuse' or 'repeat', got {partial!r}")
    splits = [_split_of(i, state) for i, state in enumerate(states)]
    _agree(splits)
    if partial == "refuse":
        _check_partial(states, splits)
    first = splits[0]
    n, count = first["n"], first["count"]
    prior = settled_of(n, first["history"])
    by_part = sorted(zip(splits, states, strict=True), key=lambda pair: pair[0]["index"])
    phase = {"count": count, "remainder": first["remainder"],
             # each checked by _settle, which names the part whose positions are missing
             "positions": [state.get("positions") for _, state in by_part]}
    settled = _settle(n, prior, phase)
    history = [*first["history"], phase]
    return Remaining(n, first["listing"], first["remainder"], bool(first["shuffle"]),
                     first["seed"], first["epoch"], settled, history)


def settled_of(n: int, history: Any) -> Span | None:
    """The ordinals (of ``n``) that the jobs of ``history`` settled (``None``: no job yet).

    Raises:
        ConfigError: ``history`` is not a list of :attr:`Remaining.history` entries.
    """
    if not isinstance(history, list):
        raise ConfigError(f"a split's history must be a list, got {history!r:.60}")
    settled = None
    for phase in history:
        if (not isinstance(phase, Mapping) or set(phase) != {"count", "remainder", "positions"}
                or phase["remainder"] not in ("pad", "drop")
                or not isinstance(phase["positions"], list)
                or len(phase["positions"]) != phase["count"]):
            raise ConfigError(f"a split's history holds a bad entry: {phase!r:.80}")
        settled = _settle(n, settled, phase)
    return settled


def _settle(n: int, prior: Span | None, phase: Mapping[str, Any]) -> Span:
    """``prior`` and what the parts of one job (``phase``) settled, as ordinals of ``n``."""
    count, remainder = phase["count"], phase["remainder"]
    ordinals = resumed_ordinals(n, prior, 0, 1, "pad")  # those left, in order
    # the ordinals the parts take together, the padding left out
    cut_to = min(len(ordinals), part_size(len(ordinals), count, remainder=remainder) * count)
    done: list[int] = []
    for index, positions in enumerate(phase["positions"]):
        taken = resumed_ordinals(n, prior, index, count, remainder)
        span = Span.from_json(positions, f"part {index}'s positions", len(taken))
        for low, high in span.intervals():
            # local position j is the part's (index + j * count)-th of the cut: past
            # cut_to it is a "pad" repeat, which settles nothing
            done.extend(taken[j] for j in range(low, high) if index + j * count < cut_to)
    dropped = [(k, k + 1) for k in ordinals[cut_to:]]
    return Span.of(0, done, [*(prior.intervals() if prior else []), *dropped])
