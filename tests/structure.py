"""The package's structure, measured from its source: every import, every code line.

``python -m tests.structure`` prints the figures issue 24 tracks; ``tests/test_structure.py``
holds the ones that must stay at zero (import cycles between files, imports that point up a
layer), and ``tests/pipeline/test_import_direction.py`` the rules between features.

Every module under ``asyncflow/`` is parsed (not imported), and every import is collected:
absolute and relative, at module level, inside functions, under ``if TYPE_CHECKING:``, and
``importlib.import_module("...")`` with a literal name. A type-only import is an import too: it
ties one file's source to the other all the same.

The layers are those docs/concepts.md draws ("The picture"), bottom first: an import may point
down or across its own layer, never up.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "asyncflow"
ENGINE = "asyncflow.pipeline"

#: Bottom first. Each entry names modules or packages (a package covers everything under it);
#: the public face (``asyncflow/__init__.py``) is matched on its own name only.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("asyncflow._errors", "asyncflow._redact", "asyncflow._scope", "asyncflow._lazy",
              "asyncflow._tree", "asyncflow._recycle", "asyncflow._blob", "asyncflow._identity")),
    ("workers", ("asyncflow.workers",)),
    ("engine", (ENGINE,)),
    ("services", ("asyncflow.ranks", "asyncflow.journal")),
    ("features", ("asyncflow.sources", "asyncflow.image", "asyncflow.torch", "asyncflow.cache",
                  "asyncflow.report")),
    ("face", ("asyncflow", "asyncflow.__main__", "asyncflow.cli")),
)


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    target: str

    def where(self) -> str:
        file = self.file
        if file.is_relative_to(PACKAGE.parent):
            file = file.relative_to(PACKAGE.parent)
        return f"{file}:{self.line}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _targets(node: ast.AST, package: str) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1])
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        for alias in node.names:
            # ``from . import _display`` imports a module; ``from . import Pipeline`` a name.
            name = f"{module}.{alias.name}"
            yield name if _is_module(name) else module
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute | ast.Name)
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
        in ("import_module", "__import__")
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        yield node.args[0].value


def collect_imports(path: Path, module: str | None = None) -> list[Import]:
    """Every import in the module at ``path`` (named ``module``, by default from its place
    under ``asyncflow/``), at any depth, as absolute module names."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[Import, None] = {}
    for node in ast.walk(tree):
        for target in _targets(node, package):
            if target == "asyncflow" or target.startswith("asyncflow."):
                found[Import(path, getattr(node, "lineno", 0), target)] = None
    return list(found)


@functools.cache
def all_imports() -> dict[str, list[Import]]:
    """Every module of the package, by name, with its imports."""
    return {module_name(p): collect_imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _file_of(target: str, modules: Mapping[str, object]) -> str:
    """The module a target names: ``asyncflow.x.Name`` (an ``importlib`` literal naming an
    attribute) falls back to ``asyncflow.x``."""
    while target not in modules and "." in target:
        target = target.rpartition(".")[0]
    return target


def graph(within: str = "asyncflow") -> dict[str, set[str]]:
    """File-to-file import edges among the modules under ``within``."""
    imports = all_imports()
    return {
        module: {
            target for imp in found
            if under(target := _file_of(imp.target, imports), within) and target != module
        }
        for module, found in imports.items() if under(module, within)
    }


def components(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components (Tarjan), each sorted, in reverse topological order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: list[str] = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def cycles(within: str = "asyncflow") -> list[list[str]]:
    """Groups of files that import each other, directly or around a loop."""
    return [group for group in components(graph(within)) if len(group) > 1]


def longest_chain(edges: Mapping[str, Iterable[str]]) -> list[str]:
    """The longest path of imports in ``edges``, each import cycle counted as one step (named
    by its first member)."""
    groups = components(edges)
    owner = {node: group[0] for group in groups for node in group}
    best: dict[str, list[str]] = {}
    for group in groups:  # reverse topological: what a group imports is already measured
        head = group[0]
        below = [best[owner[t]] for node in group for t in edges.get(node, ()) if owner[t] != head]
        best[head] = [head, *max(below, key=len, default=[])]
    return max(best.values(), key=len, default=[])


def layer_of(module: str) -> int | None:
    for rank, (_, names) in enumerate(LAYERS):
        if any(module == name if name == "asyncflow" else under(module, name) for name in names):
            return rank
    return None


def unplaced() -> list[str]:
    """Modules no layer names (each must be placed)."""
    return [module for module in all_imports() if layer_of(module) is None]


def upward_imports() -> list[str]:
    """Imports from a lower layer up to a higher one, as ``file:line: a -> b`` lines."""
    imports = all_imports()
    found = []
    for module, found_here in imports.items():
        low = layer_of(module)
        for imp in found_here:
            high = layer_of(_file_of(imp.target, imports))
            if low is not None and high is not None and high > low:
                found.append(f"{imp.where()}: {module} ({LAYERS[low][0]}) imports "
                             f"{imp.target} ({LAYERS[high][0]})")
    return found


def code_lines(path: Path) -> int:
    """Lines that hold code: not blank, not only a comment, not part of a docstring (a string
    standing alone as a statement)."""
    source = path.read_text()
    text_only: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            text_only.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - text_only)


def count_code_lines(within: str = "asyncflow") -> int:
    root = PACKAGE.parent.joinpath(*within.split("."))
    return sum(code_lines(p) for p in sorted(root.rglob("*.py")))


def loose_modules() -> list[str]:
    """Modules at the package's top level besides ``__init__`` and ``__main__``."""
    return sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))


def largest_modules(count: int = 5) -> list[tuple[int, str]]:
    sizes = [(len(p.read_text().splitlines()), str(p.relative_to(PACKAGE.parent)))
             for p in PACKAGE.rglob("*.py")]
    return sorted(sizes, reverse=True)[:count]


def report() -> str:
    found = cycles()
    chain = longest_chain(graph(ENGINE))
    engine = [m for m in all_imports() if under(m, ENGINE)]
    lines = [
        f"import cycles between files: {len(found)}",
        *(f"  {len(group)} files: {', '.join(group)}" for group in found),
        f"imports up a layer: {len(upward_imports())}",
        *(f"  {line}" for line in upward_imports()),
        f"modules no layer places: {len(unplaced())} {unplaced()}",
        f"longest import chain inside {ENGINE}: {len(chain)} ({' -> '.join(chain)})",
        f"engine import cycles: {len(cycles(ENGINE))}",
        f"library code lines: {count_code_lines()}",
        f"engine code lines: {count_code_lines(ENGINE)} ({len(engine)} modules)",
        f"loose top-level modules: {len(loose_modules())} ({', '.join(loose_modules())})",
        "largest modules: " + ", ".join(f"{p} {n}" for n, p in largest_modules()),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
