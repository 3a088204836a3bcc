"""Checks of the arguments asyncflow's DataLoader adds to torch's, and of those it refuses."""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError, ConfigTypeError, check_budget, check_int

__all__ = ["check_extras", "check_fork", "refuse_unsupported", "start_method"]

# Arguments of other loaders that migrating code passes, and what to do instead.
_INSTEAD = {
    "snapshot_every_n_steps": "torchdata's StatefulDataLoader option is not needed: "
                              "asyncflow's state_dict() is exact at every batch",
    "worker_prefetch_factor": "use prefetch_factor=",
    "num_threads": "use num_workers= with workers='threads'",
    "non_blocking": "device= copies batches without blocking, from pinned memory",
}


def refuse_unsupported(unsupported: dict[str, Any]) -> None:
    """Refuse arguments neither torch's DataLoader nor asyncflow's takes, saying what to use.

    Raises:
        ConfigTypeError: Always, when ``unsupported`` is not empty (a ``TypeError``, as
            Python raises for an unexpected keyword).
    """
    if not unsupported:
        return
    name = sorted(unsupported)[0]
    hint = _INSTEAD.get(
        name, "asyncflow.DataLoader takes torch.utils.data.DataLoader's arguments, plus "
              "device=, seed=, max_failures= and workers="
    )
    raise ConfigTypeError(f"DataLoader got an unexpected keyword argument {name!r}: {hint}")


def check_extras(*, workers: Any, seed: Any, generator: Any, max_failures: Any) -> None:
    """Check the options asyncflow adds.

    Raises:
        ConfigError: One is out of range, or ``seed`` and ``generator`` are both given.
    """
    if workers not in ("auto", "threads", "processes"):
        raise ConfigError(f"workers must be 'auto', 'threads' or 'processes', got {workers!r:.80}")
    if check_int("seed", seed, None, allow_none=True) is not None and generator is not None:
        raise ConfigError("give generator= or seed=, not both")
    check_budget("max_failures", max_failures)


def start_method(context: Any) -> str:
    """The start method for worker processes: ``context`` (a name or a multiprocessing
    context) if it is ``spawn``, ``forkserver`` or ``fork``; ``forkserver`` for ``None``
    (a map-style loader's default is fork where safe, else this: ``_layout.worker_spec``).

    ``fork`` forks the loader's process once per pool, when an epoch's run is built on the
    consumer's thread, and only if no other Python thread runs then (else iterating raises
    :class:`ConfigError` naming them; see :class:`asyncflow.Processes`).
    """
    name = context if isinstance(context, str) else getattr(
        context, "get_start_method", lambda: None)()
    if name in ("spawn", "forkserver", "fork"):
        return str(name)
    return "forkserver"  # None, or an unknown name or context: torch's own check says so


def check_fork(context: Any, dataset: Any, workers: Any, num_workers: Any) -> None:
    """Refuse ``fork`` for an ``IterableDataset`` on processes.

    Raises:
        ConfigError: Its workers' pools are built inside the loader's own run, beside that
            run's threads, where forking is never safe (see :func:`start_method`).
    """
    from torch.utils.data import IterableDataset

    if (start_method(context) == "fork" and isinstance(dataset, IterableDataset)
            and workers != "threads" and num_workers != 0):
        raise ConfigError(
            "multiprocessing_context='fork' serves map-style Datasets: an IterableDataset's "
            "workers start inside the loader's own run, beside its threads, where a fork can "
            "deadlock; pass 'forkserver' (the default) or 'spawn', or workers='threads'"
        )
