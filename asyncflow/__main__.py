"""``python -m asyncflow`` and the ``asyncflow`` console script."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``asyncflow`` command line; returns the exit status."""
    from .cli import run

    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
