"""Files are named after what they hold: outside the engine, no module is named like one of
the package's subpackages (``torch/_ranks.py`` beside ``asyncflow/ranks/``, ``cache/_pipeline.py``
beside ``asyncflow/pipeline/`` read as the same thing)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "asyncflow"

#: Modules allowed a subpackage's name (none: the engine's ``_source.py`` is ``_shared_source.py``).
ENGINE_EXCEPTIONS: set[str] = set()


def _word(name: str) -> str:
    return name.strip("_").removesuffix("s")


def test_no_module_is_named_like_another_subpackage() -> None:
    packages = {_word(p.name) for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert {"pipeline", "rank", "source", "cache", "journal"} <= packages
    alike = [
        str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
        if _word(path.stem) in packages and _word(path.parent.name) != _word(path.stem)
        and str(path.relative_to(PACKAGE)) not in ENGINE_EXCEPTIONS
    ]
    assert not alike, f"named like another subpackage (name them after what they hold): {alike}"
