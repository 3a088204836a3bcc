"""``asyncflow/pipeline/EXTENDING.md``: its example runs, and it shows public seams only."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import asyncflow.pipeline
from asyncflow.pipeline import StageTraits

EXTENDING = Path(asyncflow.pipeline.__file__).with_name("EXTENDING.md")


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", EXTENDING.read_text(), flags=re.M | re.S)


def test_the_third_party_stage_example_runs(leak_check: None) -> None:
    example = _python_blocks()[0]
    assert "with_stage(" in example and "@node_for(" in example and "TRAITS" in example
    # run as written: without this module's `from __future__ import annotations`
    exec(compile(example, str(EXTENDING), "exec", dont_inherit=True),
         {"__name__": "extending_example"})


def test_the_custom_spec_example_runs(leak_check: None) -> None:
    example = next(b for b in _python_blocks() if "CustomSpec(" in b)
    assert "traits=StageTraits(" in example
    exec(compile(example, str(EXTENDING), "exec", dont_inherit=True),
         {"__name__": "extending_custom_example"})


def test_every_trait_is_documented_with_its_readers() -> None:
    text = EXTENDING.read_text()
    for field in dataclasses.fields(StageTraits):
        assert f"| `{field.name}` |" in text, field.name


def test_the_examples_use_public_names_only() -> None:
    private = []
    for block in _python_blocks():
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [*node.module.split("."), *(a.name for a in node.names)]
                private += [n for n in names if n.startswith("_")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not (
                node.attr.startswith("__") and node.attr.endswith("__")
            ):
                private.append(node.attr)
    assert private == []


def test_every_seam_it_names_is_public() -> None:
    text = EXTENDING.read_text()
    for name in ("CustomSpec", "NodeContext", "Receiver", "Sender", "RunPlan", "RunOptions",
                 "register_feature", "feature", "StageSpec", "StageTraits", "node_for"):
        assert f"`{name}" in text or f" {name}" in text, name
        assert name in asyncflow.pipeline.__all__, name
    for method in ("with_stage", "with_stages", "with_hook", "without_hooks", "with_options",
                   "with_source", "run_plan", "hooks"):
        assert f"{method}" in text, method
        assert not method.startswith("_") and hasattr(asyncflow.pipeline.Pipeline, method)
