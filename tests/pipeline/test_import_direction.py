"""Imports point one way: the engine knows none of its features, and features only the layers
below them.

Every module under ``asyncflow/`` is parsed (not imported) by ``tests/structure.py``, and every
import is collected: absolute and relative, at module level, inside functions, under
``if TYPE_CHECKING:``, and ``importlib.import_module("...")`` with a literal name. A type-only
import is an import too: it ties the engine's source to the feature all the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.structure import all_imports, collect_imports, under

#: What the engine (``asyncflow.pipeline``) may import besides itself: the error tree, the
#: two helpers it is built on, the one checksum and listing identity (which resume shares with
#: the cache, ranks and the journal), and the worker processes below it (their public names only:
#: ``test_only_the_workers_import_their_private_modules``). Features attach through its public
#: seams instead (``asyncflow/pipeline/EXTENDING.md``); the public face registers them.
ENGINE_MAY_IMPORT = (
    "asyncflow._errors", "asyncflow._redact", "asyncflow._scope", "asyncflow._identity",
    "asyncflow.workers",
)

_FEATURES = (
    "asyncflow.torch", "asyncflow.cache", "asyncflow.sources", "asyncflow.image",
    "asyncflow.report",
)
_FRONT = ("asyncflow.cli", "asyncflow.__main__")

#: (importer, forbidden targets, why). A name covers the module and everything under it.
RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("asyncflow.sources",
     ("asyncflow.torch", "asyncflow.cache", "asyncflow.image", "asyncflow.report", *_FRONT),
     "sources say where items come from; they know nothing of what consumes them"),
    ("asyncflow.image",
     ("asyncflow.torch", "asyncflow.cache", "asyncflow.sources", "asyncflow.report", *_FRONT),
     "image decoding is pure and torch-free (its worker processes never load torch)"),
    ("asyncflow.cache",
     ("asyncflow.torch", "asyncflow.image", "asyncflow.sources", "asyncflow.report", *_FRONT),
     "the cache stores any pipeline's output through the engine's public seams"),
    ("asyncflow.torch",
     ("asyncflow.cache", "asyncflow.image", "asyncflow.report", *_FRONT),
     "torch integration builds on the engine and the sources, not on other features"),
    ("asyncflow.report",
     (*_FEATURES[:4], *_FRONT),
     "the tables, bars and profiler read what the engine gives them, not another feature"),
    ("asyncflow.report._tables",
     ("asyncflow.pipeline", *_FEATURES[:4], "asyncflow.report._progress",
      "asyncflow.report._profile", *_FRONT),
     "display formats what it is given (duck-typed stats and descriptions)"),
    ("asyncflow.report._progress",
     ("asyncflow.pipeline", *_FEATURES[:4], "asyncflow.report._profile", *_FRONT),
     "a progress bar is a consumer hook built from the run it is given"),
    ("asyncflow.journal",
     (*_FEATURES, *_FRONT),
     "the journal reaches image.folder through its Journaled protocol and the crops reader the "
     "face registers, never by import"),
    ("asyncflow.workers",
     ("asyncflow.pipeline", *_FEATURES, "asyncflow.ranks", "asyncflow.journal", *_FRONT),
     "worker processes are a layer below the engine: the engine builds their pools, they "
     "know nothing of it"),
    ("asyncflow._errors",
     (*_FEATURES, *_FRONT),
     "the error tree is the bottom layer: everything imports it"),
)


def test_the_engine_imports_none_of_its_features() -> None:
    bad = [
        f"{imp.where()}: the engine imports {imp.target}; asyncflow.pipeline may import only "
        f"itself and {', '.join(ENGINE_MAY_IMPORT)} (features attach through its public seams, "
        "see asyncflow/pipeline/EXTENDING.md)"
        for module, imports in all_imports().items() if under(module, "asyncflow.pipeline")
        for imp in imports
        if not under(imp.target, "asyncflow.pipeline")
        and not any(under(imp.target, ok) for ok in ENGINE_MAY_IMPORT)
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("importer, forbidden, why", RULES, ids=[r[0] for r in RULES])
def test_layers_point_one_way(importer: str, forbidden: tuple[str, ...], why: str) -> None:
    bad = [
        f"{imp.where()}: {importer} must not import {imp.target} ({why})"
        for module, imports in all_imports().items() if under(module, importer)
        for imp in imports
        if any(under(imp.target, f) for f in forbidden)
    ]
    assert not bad, "\n".join(bad)


def test_the_walker_sees_every_kind_of_import(tmp_path: Path) -> None:
    source = (
        "from __future__ import annotations\n"          # 1
        "import importlib\n"                              # 2
        "from typing import TYPE_CHECKING\n"              # 3
        "from .._errors import ConfigError\n"             # 4
        "from .. import _redact\n"                        # 5
        "if TYPE_CHECKING:\n"                             # 6
        "    from ..torch._transfer import to_device\n"   # 7
        "def f():\n"                                      # 8
        "    import asyncflow.cache\n"                    # 9
        "    from . import _spec\n"                       # 10
        "    importlib.import_module('asyncflow.sources')\n"  # 11
    )
    path = tmp_path / "_probe.py"
    path.write_text(source)
    found = {(i.line, i.target) for i in collect_imports(path, "asyncflow.pipeline._probe")}
    assert found == {
        (4, "asyncflow._errors"),
        (5, "asyncflow._redact"),
        (7, "asyncflow.torch._transfer"),
        (9, "asyncflow.cache"),
        (10, "asyncflow.pipeline._spec"),
        (11, "asyncflow.sources"),
    }


def test_features_still_reach_the_engine() -> None:
    """The rules above are not vacuous: the walker finds the arrows that should exist."""
    imports = all_imports()
    assert any(
        i.target.startswith("asyncflow.pipeline") for i in imports["asyncflow.torch._transfer"]
    )
    assert any(i.target == "asyncflow._errors" for i in imports["asyncflow.pipeline._spec"])


# The engine's public face: its package, its seeding (``seeding.py``) and its shared-memory
# names (``shm.py``). Nothing outside the engine imports its private modules: use
# ``asyncflow.pipeline``'s public names, and add one there (documented in EXTENDING.md) when a
# feature needs more.
PUBLIC_ENGINE_MODULES = {
    "asyncflow.pipeline", "asyncflow.pipeline.seeding", "asyncflow.pipeline.shm"
}


def test_features_use_the_engines_public_names() -> None:
    bad = [
        f"{imp.where()}: {module} imports the engine's private {imp.target}; import from "
        "asyncflow.pipeline (its public seams, see asyncflow/pipeline/EXTENDING.md)"
        for module, imports in all_imports().items() if not under(module, "asyncflow.pipeline")
        for imp in imports
        if under(imp.target, "asyncflow.pipeline")
        and imp.target not in PUBLIC_ENGINE_MODULES
    ]
    assert not bad, "\n".join(bad)


def test_only_the_workers_import_their_private_modules() -> None:
    bad = [
        f"{imp.where()}: {module} imports the workers' private {imp.target}; import from "
        "asyncflow.workers (its public names)"
        for module, imports in all_imports().items() if not under(module, "asyncflow.workers")
        for imp in imports
        if under(imp.target, "asyncflow.workers") and imp.target != "asyncflow.workers"
    ]
    assert not bad, "\n".join(bad)
    # not vacuous: the engine does import the workers, by their public names
    assert any(i.target == "asyncflow.workers" for i in all_imports()["asyncflow.pipeline._map"])
