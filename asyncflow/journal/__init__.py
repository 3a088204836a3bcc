"""The journal: which source items made each delivered output, and that output made again.

Layout, bottom first::

    _protocol.py  Journaled: the seam a pipeline that records its own outputs offers
                  (image.folder's batches)
    _records.py   JournalRecord and Failure: a journal file's lines read back
    _journal.py   Journal (pipe.journal(path)), explain() and rebuild()

Users meet these as ``pipe.journal(path)``, ``asyncflow.Journal``, ``asyncflow.explain`` and
``asyncflow.rebuild``. The journal imports the engine's public face and the ranks, never a
feature: ``image.folder`` meets :class:`Journaled`, and its records' crops are read through
the ``"journal_crops:image.folder"`` feature that ``asyncflow/__init__.py`` registers.
"""

from __future__ import annotations

from ._journal import Journal, explain, rebuild
from ._protocol import Journaled
from ._records import Failure, JournalRecord

__all__ = ["Failure", "Journal", "JournalRecord", "Journaled", "explain", "rebuild"]
