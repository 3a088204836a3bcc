"""What a person reads of a pipeline: its stats table, its progress bar, its profile.

Layout, bottom first::

    _tables.py    text and HTML tables of a pipeline's stages and statistics (print(pipe),
                  print(pipe.stats()), a notebook's rich display, report_every=)
    _progress.py  pipe.progress(): a consumer hook drawing a bar (a widget in a notebook)
    _profile.py   asyncflow.profile(): each stage timed at several concurrencies

The engine looks these up by name (``register_feature`` in ``asyncflow/__init__.py``); nothing
here is imported by ``import asyncflow``.
"""

from __future__ import annotations

from ._profile import ProfileReport, StageProfile, profile

__all__ = ["ProfileReport", "StageProfile", "profile"]
