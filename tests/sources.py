"""The repository's Python read as source, once a file a process: what the tests that read the source (the import
rules, the error family, the agent's answers, the fixtures' plans) ask of each module.

Each file is parsed and walked once, and only what those tests ask is kept (names, line numbers, string constants):
parsing every module was a test's whole cost, paid again by each test that read the same files, and the trees
themselves, kept, are ~100 MB of objects that each of the garbage collector's full passes walks (~0.5 s a pass).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Imported:
    """One `import NAMES` (module None) or `from MODULE import NAMES` (module "" for `from . import`), at LEVEL."""

    module: str | None
    level: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class ClassDef:
    name: str
    bases: tuple[str, ...]  # the bases that are plain names (`Exception`, `PlanError`), not `errors.PlanError`
    line: int


@dataclass(frozen=True)
class Facts:
    imports: tuple[Imported, ...]  # every import: at the top, in a function, under `if TYPE_CHECKING:`
    classes: tuple[ClassDef, ...]
    dict_keys: tuple[tuple[int, frozenset[object]], ...]  # each dict display's line and its constant keys
    strings: tuple[tuple[int, str], ...]  # each string constant and its line


@cache
def facts(path: Path) -> Facts:
    """What PATH's source says, from one parse and one walk."""
    imports, classes, dicts, strings = [], [], [], []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imports.append(Imported(None, 0, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            imports.append(Imported(node.module or "", node.level, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.ClassDef):
            bases = tuple(b.id for b in node.bases if isinstance(b, ast.Name))
            classes.append(ClassDef(node.name, bases, node.lineno))
        elif isinstance(node, ast.Dict):
            keys = frozenset(k.value for k in node.keys if isinstance(k, ast.Constant))
            dicts.append((node.lineno, keys))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append((node.lineno, node.value))
    return Facts(tuple(imports), tuple(classes), tuple(dicts), tuple(strings))
