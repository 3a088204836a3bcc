"""The package's structure holds: no import cycles between files, no import up a layer, every
module placed in a layer, an engine at most 10 imports deep (the figures themselves:
``python -m tests.structure``)."""

from __future__ import annotations

from pathlib import Path

from tests.structure import (
    ENGINE,
    LAYERS,
    code_lines,
    components,
    cycles,
    graph,
    longest_chain,
    unplaced,
    upward_imports,
)


def test_no_import_cycle_between_files() -> None:
    found = cycles()
    assert not found, f"files that import each other (move what they share down): {found}"


def test_no_import_points_up_a_layer() -> None:
    assert not upward_imports(), "\n".join(upward_imports())


def test_the_engines_longest_import_chain_is_at_most_10_modules() -> None:
    chain = longest_chain(graph(ENGINE))  # every import counts, TYPE_CHECKING ones too
    assert len(chain) <= 10, " -> ".join(chain)


def test_every_module_has_a_layer() -> None:
    assert not unplaced(), f"place these in tests/structure.py's LAYERS: {unplaced()}"
    assert LAYERS[0][1][0] == "asyncflow._errors"  # the bottom layer: everything imports it


def test_components_find_loops_and_chains_count_each_loop_once() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"b", "d"}, "d": set(), "e": {"e"}}
    assert sorted(g for g in components(edges) if len(g) > 1) == [["b", "c"]]
    assert longest_chain(edges) == ["a", "b", "d"]


def test_code_lines_leave_out_blanks_comments_and_docstrings(tmp_path: Path) -> None:
    path = tmp_path / "probe.py"
    path.write_text(
        '"""Module\n\ndocstring."""\n'      # 1-3: docstring
        "\n"                                  # 4: blank
        "# a comment\n"                       # 5: comment
        "def f(x):  # trailing comment\n"     # 6: code
        '    """One line."""\n'               # 7: docstring
        '    s = """a\n'                      # 8: code (a string in an expression)
        'b"""\n'                              # 9: code
        "    return (x,\n"                    # 10: code
        "            s)\n"                    # 11: code
    )
    assert code_lines(path) == 5
