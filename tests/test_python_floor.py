"""The runner package runs on a login node's own Python, down to runner.PYTHON_MIN (3.8): no syntax and no
type expression evaluated at run time that a 3.8 interpreter lacks. (vermin, in .ci/run, checks the standard
library's API the same way; it cannot tell an annotation, never evaluated here, from a run-time `int | str`.)"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import runner
from tests.conftest import plan_cli
from tests.sshd import Sshd

REPO = Path(__file__).resolve().parent.parent
# Builtins that can be subscripted at run time only from 3.9 on (and collections.abc's names, found per module)
GENERIC_FROM_39 = {"dict", "list", "tuple", "set", "frozenset", "type"}
TYPE_NAMES = {"int", "str", "float", "bytes", "bool", "dict", "list", "tuple", "set", "Path", "Any"}


def _annotations(nodes: list[ast.AST]) -> set[int]:
    """The ids of every node inside an annotation (never evaluated under `from __future__ import annotations`)."""
    roots: list[ast.AST] = []
    for node in nodes:
        if isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
    return {id(sub) for root in roots for sub in ast.walk(root)}


def _abc_names(nodes: list[ast.AST]) -> set[str]:
    """Names this module takes from collections.abc (typing's own aliases subscript fine on 3.8)."""
    return {
        alias.asname or alias.name
        for node in nodes
        if isinstance(node, ast.ImportFrom) and node.module == "collections.abc"
        for alias in node.names
    }


def _typeish(node: ast.AST, abc: set[str]) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    if isinstance(node, ast.Name):
        return node.id in TYPE_NAMES or node.id in abc
    if isinstance(node, ast.Subscript):
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and _typeish(node.left, abc)


def _called(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")


def problems(path: Path) -> list[str]:
    text = path.read_text()
    found: list[str] = []
    try:
        tree = ast.parse(text, str(path), feature_version=(3, 8))
    except SyntaxError as exc:
        return [f"{path}:{exc.lineno}: not Python 3.8 syntax: {exc.msg}"]
    nodes = list(ast.walk(tree))  # walked once and read three times: three walks were a quarter of its time
    skip = _annotations(nodes)
    if skip and "from __future__ import annotations" not in text:
        found.append(f"{path}:1: no `from __future__ import annotations` (its annotations would be evaluated)")
    abc = _abc_names(nodes)
    for node in nodes:
        if id(node) in skip:
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            if _typeish(node.left, abc) and _typeish(node.right, abc):
                found.append(f"{path}:{node.lineno}: `{ast.unparse(node)}` evaluated at run time needs 3.10")
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            if node.value.id in GENERIC_FROM_39 or node.value.id in abc:
                found.append(f"{path}:{node.lineno}: `{ast.unparse(node)}` evaluated at run time needs 3.9")
        elif isinstance(node, ast.Call) and _called(node) == "dataclass":
            for word in node.keywords:
                if word.arg in ("slots", "kw_only"):
                    found.append(f"{path}:{node.lineno}: dataclass({word.arg}=) needs 3.10")
        elif isinstance(node, ast.Call) and _called(node) == "zip":
            if any(word.arg == "strict" for word in node.keywords):
                found.append(f"{path}:{node.lineno}: zip(strict=) needs 3.10")
    return found


def test_the_runner_package_parses_and_imports_under_python_3_8() -> None:
    assert runner.PYTHON_MIN == (3, 8)
    found = [p for path in sorted((REPO / "runner").rglob("*.py")) for p in problems(path)]
    assert found == [], "\n".join(found)


def test_the_checker_finds_what_3_8_lacks(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from __future__ import annotations\n"
        "from collections.abc import Callable\n"
        "SlurmId = int | str\n"
        "Live = dict[str, Any]\n"
        "Handler = Callable[[str], int]\n"
        "def f(a: int | None = None) -> list[int]:\n"
        "    x: dict[str, int] = {}\n"
        "    return list(zip([1], [2], strict=True)) and [a or 0 | 1]\n"
    )
    lines = [p.split(":")[1] for p in problems(bad)]
    assert lines == ["3", "4", "5", "8"], problems(bad)
    (tmp_path / "match.py").write_text("from __future__ import annotations\nmatch 1:\n    case 1:\n        pass\n")
    assert "not Python 3.8 syntax" in problems(tmp_path / "match.py")[0]


def test_a_host_python_older_than_the_floor_is_named_with_the_hosts_file_way_out(tmp_path: Path, sshd: Sshd) -> None:
    """The loader runs first, in any Python 3: it says the version instead of the package's SyntaxError. The
    interpreter here is this machine's python3 posing as 3.6.8 (its sys.version_info set before the loader runs):
    the real ssh, the real loader, the real message."""
    old = tmp_path / "python3.6"
    old.write_text(
        "#!/bin/bash\n"
        "shift 2  # -S -c: the loader and its arguments follow\ncode=$1\nshift\n"
        f'exec {sys.executable} -c \'import sys; sys.version_info = (3, 6, 8, "final", 0); '
        'exec(compile(sys.argv.pop(1), "<loader>", "exec"))\' "$code" "$@"\n'
    )
    old.chmod(0o755)
    hosts = sshd.hosts_file(tmp_path / "q", name="oldbox")
    hosts.write_text(hosts.read_text().replace(f"python: {sys.executable}", f"python: {old}"))
    code, out = plan_cli("status", "oldbox", "--hosts", str(hosts))
    assert code == 1, out
    assert f"`{old}` there is Python 3.6.8" in out and "the runner needs Python 3.8 or newer" in out, out
    assert "`python:` in its hosts-file entry" in out and "Traceback" not in out, out
