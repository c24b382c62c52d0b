"""No module of the package uses another module's private names (the project guide: pure
functions, small modules, no module imports another module's private ``_x`` names).

An AST walk over every module under ``rhnzoo/``: a ``from rhnzoo... import _x``, and an
attribute ``a._x`` where ``a`` is a name the module bound by an import from ``rhnzoo`` (a
module, or anything it took from one), are uses of another module's private name.
Dunder names (``__version__``) are public; other libraries' names (``os._exit``, NumPy's
pickle hooks) are out of scope."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str, package: str = "rhnzoo") -> list[tuple[int, str]]:
    """``(line, what)`` for each use of a private name of ``package``'s modules in
    ``source`` (a module of the package; relative imports count as the package's)."""
    tree = ast.parse(source)
    imported: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != package:
                    continue
                imported.add(alias.asname or alias.name.split(".")[0])
                found += [(node.lineno, alias.name) for p in alias.name.split(".") if _private(p)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.split(".")[0] != package:
                continue
            for alias in node.names:
                imported.add(alias.asname or alias.name)
                if _private(alias.name) or any(_private(p) for p in module.split(".")):
                    found.append(
                        (node.lineno, f"from {'.' * node.level}{module} import {alias.name}")
                    )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
            and _private(node.attr)
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def test_the_check_finds_private_imports_and_attributes():
    source = (
        "import os, rhnzoo._private.core\n"
        "from rhnzoo.cells.kernels import gated\n"
        "from rhnzoo.cells.kernels.gated import _padded, ROWS\n"
        "from . import _sibling\n"
        "import numpy as np\n"
        "def f(x):\n"
        "    _local = 1\n"
        "    os._exit(np.__version__, x._own, _local, ROWS, np._core)\n"
        "    return gated._forward_call(x), ROWS._shape, gated.__name__\n"
    )
    assert private_uses(source) == [
        (1, "rhnzoo._private.core"),
        (3, "from rhnzoo.cells.kernels.gated import _padded"),
        (4, "from . import _sibling"),
        (9, "ROWS._shape"),
        (9, "gated._forward_call"),
    ]


def test_no_module_of_the_package_uses_another_modules_private_names():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sorted((ROOT / "rhnzoo").rglob("*.py"))
        for line, what in private_uses(path.read_text())
    ]
    assert offenders == [], "\n".join(offenders)
