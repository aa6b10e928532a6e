"""The house rule, kept by a test: no module of crawlerd uses another module's underscore names.

ruff's SLF001 (enabled for crawlerd/) flags ``obj._name`` on objects other than ``self``/``cls``.
This walks the same files with ``ast`` for what it does not see:

- ``from crawlerd.x import _name`` (a private name imported into another module);
- ``m._name`` where ``m`` is a crawlerd module bound by an import;
- ``getattr/setattr/hasattr(obj, "_name")`` on anything but ``self``/``cls``;
- a class reading ``self._name`` it never defines (nor a base class in its module does):
  a mixin working on the private state of a class in another module.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "crawlerd"
FILES = sorted(p for p in PACKAGE.rglob("*.py") if ".venv" not in p.parts)

# (file, name): the only underscore names of other code crawlerd may touch, each with its reason.
ALLOWED = {
    # the stdlib marks codecs that are not text encodings (rot13, base64...) only this way
    ("crawlerd/process/html.py", "_is_text_encoding"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module_names(tree: ast.Module) -> set[str]:
    """Local names bound to crawlerd modules: ``import crawlerd.x as m``, ``from crawlerd import url``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "crawlerd":
                    names.add(a.asname or "crawlerd")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "crawlerd":
            for a in node.names:
                if (PACKAGE.parent / (node.module.replace(".", "/") + "/" + a.name + ".py")).exists() or \
                        (PACKAGE.parent / node.module.replace(".", "/") / a.name).is_dir():
                    names.add(a.asname or a.name)
    return names


def _class_violations(tree: ast.Module) -> list[tuple[int, str]]:
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}

    def defined(c: ast.ClassDef, seen: frozenset = frozenset()) -> set[str]:
        out = set()
        for stmt in c.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.add(stmt.name)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        out.add(t.id)
                        if t.id == "__slots__" and stmt.value is not None:
                            out.update(e.value for e in ast.walk(stmt.value)
                                       if isinstance(e, ast.Constant) and isinstance(e.value, str))
        for n in ast.walk(c):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" \
                    and isinstance(n.ctx, ast.Store):
                out.add(n.attr)
            elif isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Name) \
                    and n.args[0].id == "self" and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) \
                    and isinstance(n.func, ast.Attribute) and n.func.attr == "__setattr__":
                out.add(n.args[1].value)        # object.__setattr__(self, "_x", v) in frozen classes
        for b in c.bases:
            if isinstance(b, ast.Name) and b.id in classes and b.id not in seen:
                out |= defined(classes[b.id], seen | {c.name})
        return out

    bad = []
    for c in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        mine = defined(c)
        for n in ast.walk(c):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" \
                    and isinstance(n.ctx, ast.Load) and _private(n.attr) and n.attr not in mine:
                bad.append((n.lineno, f"class {c.name} reads self.{n.attr}, defined in no class of its module"))
    return bad


def violations(path: pathlib.Path) -> list[str]:
    rel = _rel(path)
    tree = ast.parse(path.read_text(), filename=rel)
    mods = _module_names(tree)
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "crawlerd":
            for a in node.names:
                if _private(a.name):
                    found.append((node.lineno, a.name, f"imports {a.name} from {node.module}"))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in mods \
                and _private(node.attr):
            found.append((node.lineno, node.attr, f"uses {node.value.id}.{node.attr} of another module"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and _private(node.args[1].value) \
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls")):
            found.append((node.lineno, node.args[1].value, f"{node.func.id}(..., {node.args[1].value!r})"))
    found += [(line, "", what) for line, what in _class_violations(tree)]
    return [f"{rel}:{line}: {what}" for line, name, what in found if (rel, name) not in ALLOWED]


def test_the_walk_sees_the_package():
    assert len(FILES) > 50 and PACKAGE / "shard" / "shard.py" in FILES


@pytest.mark.parametrize("source, expect", [
    ("from crawlerd.frontier.items import _Out\n", "imports _Out"),
    ("from crawlerd import url as u\nx = u._hosts\n", "uses u._hosts"),
    ("import crawlerd.fetch.curl as c\nc._MIN_LIBCURL\n", "uses c._MIN_LIBCURL"),
    ("def f(o):\n    return getattr(o, '_store')\n", "getattr(..., '_store')"),
    ("class Mixin:\n    def f(self):\n        return self._store\n", "reads self._store"),
])
def test_each_kind_of_violation_is_caught(tmp_path, monkeypatch, source, expect):
    path = PACKAGE / "__structure_probe__.py"
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: source)
    assert any(expect in v for v in violations(path)), violations(path)


def test_own_privates_and_same_module_bases_are_fine(monkeypatch):
    source = ("class Base:\n    def __init__(self):\n        self._x = 1\n"
              "class Child(Base):\n    __slots__ = ('_y',)\n    def f(self):\n        return self._x + self._y\n"
              "def g(o):\n    return getattr(o, '__name__')\n")
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: source)
    assert violations(PACKAGE / "__structure_probe__.py") == []


def test_no_module_uses_another_modules_underscore_names():
    problems = [v for p in FILES for v in violations(p)]
    assert not problems, "\n".join(problems)
