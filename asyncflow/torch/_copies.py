"""The copies of the dataset a loader's workers read, kept as torch's workers keep theirs.

torch's workers get their copy of the dataset when they start: every epoch, or, with
``persistent_workers=True``, once. Changes the main process makes to the dataset later reach
the next epoch's workers, and never persistent ones. asyncflow's thread workers would read
the very object, and the worker processes ``workers="auto"`` keeps alive (starting them each
epoch is slow) would keep a copy torch's would have replaced. Here both follow torch.
"""

from __future__ import annotations

import copy
import hashlib
from typing import TYPE_CHECKING

from .._errors import ConfigError

if TYPE_CHECKING:
    from ._facade import Loader

__all__ = ["copy_for_persistent_threads", "stale_kept_workers"]


def copy_for_persistent_threads(loader: Loader) -> None:
    """Give persistent thread workers their own copy of the dataset, taken as they start.

    torch's persistent workers keep the copy of the dataset they got when they started, so
    changes the main process makes to it later do not reach them; threads would read the
    very object. So, as an epoch starts with persistent workers on threads that have no copy
    yet, they get one (``copy.deepcopy``), kept until the loader's workers are rebuilt.

    Raises:
        ConfigError: The dataset cannot be copied.
    """
    if not loader.persistent_workers or loader._copy is not None or not loader._thread_fetches:
        return
    try:
        own = copy.deepcopy(loader.dataset)
    except Exception as exc:
        raise ConfigError(
            f"persistent_workers=True: the workers keep a copy of the dataset taken when they "
            f"start, as torch's do, and {type(loader.dataset).__qualname__} cannot be copied "
            f"({type(exc).__name__}: {exc}); pass persistent_workers=False to have threads read "
            "the dataset itself"
        ) from exc
    loader._copy = own
    for fetch in loader._thread_fetches:
        fetch.dataset = own


def stale_kept_workers(loader: Loader) -> bytes | None:
    """Whether the worker processes kept alive for a loader that did not ask for persistent
    workers hold a copy of the dataset that differs from the dataset now: then, as torch's
    workers would be, they must start again, with the dataset as it is.

    The dataset is compared by a digest of its pickle, noted when the workers start: about
    what sending it to fresh workers every epoch, as torch does, costs.

    Returns:
        The dataset's new digest, to note once the caller has rebuilt the workers; ``None``
        while they are current.
    """
    if not loader._kept_alive:
        return None
    import cloudpickle

    try:
        digest = hashlib.blake2b(cloudpickle.dumps(loader.dataset, protocol=5)).digest()
    except Exception:  # the workers received it once: a later failure to pickle changes nothing
        return None
    if loader._sent_digest is None:
        loader._sent_digest = digest
    return None if digest == loader._sent_digest else digest
