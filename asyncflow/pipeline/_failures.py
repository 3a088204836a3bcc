"""The failure policy: fail fast by default; with a budget, skip, count and report (an item
is named by ``asyncflow._redact.describe_item``)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from .._errors import FailureBudgetExceeded
from .._redact import describe_exception, redact
from ._stats import FailureRecord

__all__ = ["FailureBudget"]

logger = logging.getLogger("asyncflow")

class FailureBudget:
    """How many items a stage may fail on before the pipeline fails.

    Args:
        limit: An int (that many failures allowed) or a float fraction of the items the stage
            has seen. A fraction is checked with a grace of one failure while few items have
            been seen, and exactly at the end of the stream.
        stage: The stage's name, for logs and errors.

    Attributes:
        records: The stage's failure records (the run shares its counters' list here), which
            :class:`~asyncflow.FailureBudgetExceeded` carries.
    """

    _LOGGED_IN_FULL = 5
    _SUMMARY_EVERY = 5.0

    def __init__(self, limit: int | float, stage: str) -> None:
        self.limit = limit
        self.stage = stage
        self._logged = 0
        self._unlogged = 0
        self._last_summary = time.monotonic()
        self.records: Sequence[FailureRecord] = ()

    def allows(self, failures: int, seen: int) -> bool:
        """Whether ``failures`` out of ``seen`` items are still within the budget."""
        if isinstance(self.limit, float):
            if self.limit <= 0.0:
                return failures == 0
            return failures <= max(1.0, self.limit * seen)
        return failures <= self.limit

    def check_end(self, failures: int, seen: int) -> None:
        """At the end of the stream: raise if the budget is exceeded or every item failed.

        Raises:
            FailureBudgetExceeded: Carrying the stage's failure records.
        """
        if seen and failures == seen:
            raise self._exceeded(
                f"stage {self.stage!r}: every one of its {seen} items failed; "
                "an epoch that yields nothing is treated as an error"
            )
        if isinstance(self.limit, float) and failures > self.limit * seen:
            raise self._exceeded(
                f"stage {self.stage!r}: {failures} of {seen} items failed "
                f"({failures / seen:.1%}), over the budget of {self.limit:.1%}"
            )

    def _exceeded(self, message: str) -> FailureBudgetExceeded:
        records = [dataclasses.replace(r, message=redact(r.message)) for r in self.records]
        return FailureBudgetExceeded(message, stage=self.stage, failures=records)

    def log_skip(self, item: str, exc: BaseException) -> None:
        """Log a skipped item: the first few in full, then a periodic count."""
        if self._logged < self._LOGGED_IN_FULL:
            self._logged += 1
            logger.warning(
                "stage %r: skipped item %s: %s", self.stage, item, describe_exception(exc)
            )
            return
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last_summary >= self._SUMMARY_EVERY:
            logger.warning(
                "stage %r: skipped %d more failed items (see pipe.stats().failures)",
                self.stage, self._unlogged,
            )
            self._unlogged = 0
            self._last_summary = now
