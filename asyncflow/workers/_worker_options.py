"""How a sync stage's work is spread: threads (the default) or worker processes.

Threads suit work that releases the GIL (file reads, NumPy, most of PIL's decoding); processes
suit work that holds it (pure-Python transforms, a Dataset's ``__getitem__``), and free the
consumer's own Python (a training step) from competing with the workers for the GIL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from .._errors import ConfigError, check_flags, check_int
from ._seeding import fresh_seed

__all__ = [
    "Processes",
    "WorkerInfo",
    "register_worker_setup",
    "resolve_workers",
    "run_worker_setups",
    "worker_info",
    "worker_setups",
]

StartMethod = Literal["forkserver", "spawn", "fork"]


@dataclass(frozen=True, kw_only=True)
class WorkerInfo:
    """Who this worker process is (see :func:`worker_info`).

    Attributes:
        id: The worker's number, ``0 <= id < num_workers``. A replacement for a dead worker
            takes its number.
        num_workers: How many worker processes the stage has.
        seed: The stage's base seed; each item is seeded from it, the epoch and the item's
            position (see :class:`Processes`).
        stage: The stage's name.
        pid: The worker's process id.
    """

    id: int
    num_workers: int
    seed: int
    stage: str
    pid: int


@dataclass(frozen=True, kw_only=True)
class Processes:
    """Run a sync stage in worker processes: ``pipe.map(fn, workers=Processes(...))``.

    The function (with its closure or dataset) is sent to each worker once, at start: by
    reference when it can be imported there, by value otherwise (cloudpickle: functions and
    classes defined in a notebook cell work). Items go in adaptive chunks; NumPy arrays and
    tensors in the results come back through shared memory, not through the pipe. Exceptions
    keep their remote traceback (as a note); a worker that dies (a segfault, the OOM killer) is
    reported with the item it held, and replaced.

    Before each item the worker seeds ``random``, NumPy's global generator and torch's (those
    that are imported) from ``(seed, epoch, position of the item in the stage's input)``
    (:func:`asyncflow.pipeline.seeding.item_seed`): random augmentations are reproducible
    whichever worker takes the item. A source that keys its items
    (:class:`~asyncflow.pipeline.seeding.KeyedIterator`: a ``Split`` share, by list index)
    gives the key in place of the position, to the stages in step with it.

    Args:
        start_method: ``"forkserver"`` (default: workers fork from a clean server process that
            has imported NumPy, PIL and torch once, if the parent had), ``"spawn"``, or
            ``"fork"`` (Linux): the workers share the parent's pages copy-on-write, as torch's
            forked workers do, and the function and its data are not pickled (a Dataset that
            cannot be pickled works). Forking a process that runs other threads can deadlock the
            child, so the parent is forked once, when the run is built, and only if no other
            Python thread runs then but other pools' idle readers (else building the run
            raises :class:`ConfigError`, saying which threads, unless ``fallback`` is set);
            that child forks the workers, and replaces a dead one. On the issue-23 images job,
            fork held 1.04x torch's memory, the forkserver 1.68x (docs/performance.md). Not
            this class's default: a pipeline built beside a running thread (Jupyter's, another
            run's) would be refused. ``asyncflow.DataLoader`` and ``image.folder`` ask for fork
            with a fallback.
            As with torch's DataLoader, a worker does not import the main script again (unlike
            a plain multiprocessing child): a script needs no ``if __name__ == "__main__":``
            guard, and its top-level code runs once.
        persistent: Keep the workers from one run (epoch) to the next. They then belong to the
            pipeline object, and stop when it is garbage-collected or at interpreter exit.
            ``False`` (default): they belong to the run, and stop with it.
        init: Called in each worker once, after start, with its :class:`WorkerInfo` (torch's
            ``worker_init_fn`` takes ``info.id``). Sent like the function.
        seed: The base seed (default: drawn once, when the stage is added).
        reseed: Seed the generators before each item (default). ``False``: only ``init``
            seeds them, once per worker, as torch's ``worker_init_fn`` does.
        fallback: With ``start_method="fork"`` only: where the parent cannot be forked when
            the pool is built (checked then, under the same gates as the fork itself, so a
            thread started in between cannot turn the choice into an error), start the
            workers with ``"forkserver"`` or ``"spawn"`` instead of raising. The run's
            ``stats().notes`` then say which start method the workers got, and why. ``None``
            (default): fork or raise. On the fallback the function and its data are pickled;
            if they cannot be, building the run raises :class:`ConfigError` naming both
            reasons.

    Raises:
        ConfigError: An option is invalid.
    """

    start_method: StartMethod = "forkserver"
    persistent: bool = False
    init: Callable[[WorkerInfo], Any] | None = None
    seed: int | None = None
    reseed: bool = True
    fallback: Literal["forkserver", "spawn"] | None = None

    def __post_init__(self) -> None:
        if self.start_method not in ("forkserver", "spawn", "fork"):
            raise ConfigError(
                f"start_method must be 'forkserver', 'spawn' or 'fork', got "
                f"{self.start_method!r}"
            )
        if self.fallback not in (None, "forkserver", "spawn"):
            raise ConfigError(f"fallback must be None, 'forkserver' or 'spawn', got "
                              f"{self.fallback!r}")
        if self.fallback is not None and self.start_method != "fork":
            raise ConfigError(f"fallback= is the start method used where fork is refused; "
                              f"start_method={self.start_method!r} is never refused")
        check_flags(self, "persistent", "reseed")
        if self.init is not None and not callable(self.init):
            raise ConfigError(f"init must be callable, got {self.init!r:.80}")
        check_int("seed", self.seed, None, allow_none=True)


def resolve_workers(workers: Any) -> Processes | None:
    """``None`` for threads, a :class:`Processes` with a seed for processes.

    Raises:
        ConfigError: ``workers`` is not ``"threads"``, ``"processes"`` or a ``Processes``.
    """
    if workers == "threads":
        return None
    if workers == "processes":
        workers = Processes()
    if not isinstance(workers, Processes):
        raise ConfigError(
            f"workers must be 'threads', 'processes' or an asyncflow.Processes(...), got "
            f"{workers!r:.80}"
        )
    return workers if workers.seed is not None else replace(workers, seed=fresh_seed())


_current: WorkerInfo | None = None


def worker_info() -> WorkerInfo | None:
    """The current worker process's :class:`WorkerInfo`; ``None`` outside a worker."""
    return _current


def set_worker_info(info: WorkerInfo) -> None:
    global _current
    _current = info


_setups: dict[Callable[[], Any], None] = {}
_ran: set[Callable[[], Any]] = set()  # in a worker: the hooks already run


def register_worker_setup(hook: Callable[[], Any]) -> None:
    """Call ``hook()`` once in every worker process at start, before the stage's ``init``.

    ``hook`` must be importable by reference (a module-level function): ``asyncflow.torch``
    registers one that limits torch to one thread per worker, as torch's DataLoader does. A
    hook registered inside a worker that has started (its module imported late, with the
    stage function's own imports) runs at once.
    """
    _setups[hook] = None
    if _current is not None:
        run_worker_setups()


def worker_setups() -> list[Callable[[], Any]]:
    return list(_setups)


def run_worker_setups(hooks: Iterable[Callable[[], Any]] = ()) -> None:
    """In a worker: run ``hooks`` and every hook registered in this process, each once.

    The registry of this process counts: a module imported before the worker started (a
    forkserver's preloads, asyncflow.torch among them) registered its hook there, with no
    worker to run it in yet.
    """
    for hook in [*hooks, *_setups]:
        if hook not in _ran:
            _ran.add(hook)
            hook()

