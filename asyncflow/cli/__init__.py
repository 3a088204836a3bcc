"""The ``asyncflow`` command (``python -m asyncflow``, the ``asyncflow`` console script).

Layout::

    _command.py  the parser and the subcommands: demo, info, bench, cache info PATH
    _demo.py     asyncflow demo: the image-folder pipeline on sample pictures

Each subcommand imports what it needs when it runs, so ``asyncflow --help`` starts fast.
"""

from __future__ import annotations

from ._command import run

__all__ = ["run"]
