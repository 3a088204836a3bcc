"""The docs site builds with ``mkdocs build --strict``, and the README's example is real code
that runs."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for entry in nav for p in _nav_pages(entry)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return []


def _load_mkdocs() -> dict[str, object]:
    # mkdocs.yml may hold !!python/name tags (none now); the safe loader is enough for nav.
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONWARNINGS="ignore")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    api = (tmp_path / "site" / "api" / "pipeline" / "index.html").read_text()
    assert "Pipeline" in api


def test_every_page_is_in_the_nav() -> None:
    nav = set(_nav_pages(_load_mkdocs()["nav"]))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - pages == set(), "nav entries without a page"


def test_performance_placeholders_only_in_performance_page() -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        if page.name != "performance.md":
            assert "TBD" not in page.read_text(), page


def _python_blocks(markdown: str) -> list[str]:
    """The ```python blocks, dedented (blocks inside tabs are indented)."""
    found = re.findall(r"^( *)```python\n(.*?)^\1```", markdown, flags=re.S | re.M)
    return [textwrap.dedent(body) for _, body in found]


def _parse(block: str, where: str) -> None:
    # Notebook-style snippets use top-level ``async for``.
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        compile(block, where, "exec", flags=flags)
    except SyntaxError as exc:
        pytest.fail(f"{where}: {exc}\n{block}")


def test_readme_has_the_two_commands_and_valid_python() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    blocks = _python_blocks(readme)
    assert blocks, "the README shows an example"
    for block in blocks:
        _parse(block, "README.md")


def test_readme_first_example_yields_a_tensor_batch(tmp_path: Path) -> None:
    """The README's first example, run as written on the demo's images: ``urls`` are their
    paths, and ``train_step`` receives float32 NCHW tensor batches a model can take."""
    import torch

    from asyncflow.image import sample_folder

    root = sample_folder(tmp_path / "images", images=70)
    urls = sorted(str(p) for p in root.rglob("*.jpg"))
    batches: list[object] = []
    example = _python_blocks((ROOT / "README.md").read_text())[0]
    exec(compile(example, "README.md", "exec"), {"urls": urls, "train_step": batches.append})
    assert len(batches) == 2, [type(b) for b in batches]
    first, last = batches
    assert isinstance(first, torch.Tensor) and isinstance(last, torch.Tensor), type(first)
    assert first.dtype == torch.float32 and first.shape == (64, 3, 224, 224)
    assert last.shape == (6, 3, 224, 224) and first.is_contiguous()
    assert -3 < first.mean().item() < 3  # normalized, not 0-255


def test_docs_python_blocks_parse() -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        for block in _python_blocks(page.read_text()):
            _parse(block, str(page.relative_to(ROOT)))


# Public names the API reference covers another way: the errors through their module's page,
# sub-packages through their own pages, constants in prose, torch's own default_collate.
_DOCUMENTED_ELSEWHERE = {
    "AsyncflowError", "ConfigError", "ConfigTypeError", "LoaderTimeout", "DecodeError",
    "PipelineError", "RebuildWarning", "SourceError",
    "SourceNotFound", "SourcePermissionError", "SourceTimeout", "StallError", "WorkerError",
    "FailureBudgetExceeded", "image", "sources", "__version__", "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_BYTES", "IMAGENET_MEAN", "IMAGENET_STD", "IMG_EXTENSIONS", "default_collate",
}


@pytest.mark.parametrize(
    "module",
    ["asyncflow", "asyncflow.image", "asyncflow.sources", "asyncflow.torch", "asyncflow.cache"],
)
def test_api_reference_covers_every_public_name(module: str) -> None:
    import importlib

    api = "\n".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    documented = {i.rsplit(".", 1)[-1] for i in re.findall(r"^::: (\S+)", api, flags=re.M)}
    public = set(importlib.import_module(module).__all__)
    assert public - documented - _DOCUMENTED_ELSEWHERE == set()
