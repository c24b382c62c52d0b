"""The package's layers: no import runs upward, and no two modules import each other.

Every ``import`` of ``rhnzoo`` in every module counts, those inside functions too (a
deferred import is still a dependency). Layers, bottom to top, one folder each: the
numerics (cells, data, dropout masks, precision), models, configs (the ``setting``
machinery and each task's config classes and presets), the evaluation shared by training
and analysis (sums of a batch, batches of a split), the run engine, analysis (reads
workdirs, never a trainer), the tasks, the studies (a paper's runs and tables), the
applications (``rhnzoo/apps``: each paper's flags and body), the benchmarks;
``experiments/*.py`` stand on top. Beside the package, the project's own tools
(``tools/``: the harvest, the renderer, the kernels' record, the GPU probes of
``tools/gpu/``, ...) are the top floor: a tool may import rhnzoo, rhnzoo never imports a
tool (issue 70).
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = (
    ("cells", "data", "dropout", "precision"),
    ("models", "nnx"),
    ("config", "configs"),
    ("evaluation",),
    ("engine",),
    ("analysis",),
    ("tasks",),
    ("studies",),
    ("apps",),
    ("bench",),
)
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}
TOOLS = len(LAYERS)  # tools/: above every floor of the package
SCANNED = ("rhnzoo", "tools")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: pathlib.Path) -> set[str]:
    """The rhnzoo and tools modules (or packages) that ``path`` imports, anywhere in the
    file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in SCANNED}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in SCANNED:
            for a in node.names:  # ``from rhnzoo.data import text``: the module text
                sub = f"{node.module}.{a.name}"
                found.add(sub if is_module(sub) else node.module)
    return found


def graph() -> dict[str, set[str]]:
    return {
        module_name(p): imports(p) for top in SCANNED for p in sorted((ROOT / top).rglob("*.py"))
    }


def layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] == "tools":
        return TOOLS
    return RANK.get(parts[1]) if len(parts) > 1 else None


def test_every_part_of_the_package_has_a_layer():
    parts = {m.split(".")[1] for m in graph() if m.startswith("rhnzoo.")}
    assert parts == set(RANK), "give a new part of rhnzoo its layer in LAYERS"


def test_the_tools_stand_on_the_package_and_the_package_never_imports_a_tool():
    modules = graph()
    assert {
        "tools.harvest.chunks",
        "tools.harvest.__main__",
        "tools.render",
        "tools.kernel_record",
        "tools.gpu.kernel_probe",  # the GPU probes, run by path from tools/gpu/
        "tools.gpu.kernel_ptxas",
        "tools.gpu.pallas_probe",
        "tools.gpu.lm_ops",
    } <= set(modules)
    assert any(b.startswith("rhnzoo") for b in modules["tools.harvest.records"])
    assert "rhnzoo.cells.kernels.verified" in modules["tools.gpu.kernel_probe"]
    assert "rhnzoo.cells.kernels.verified" in modules["tools.kernel_record"]
    assert "rhnzoo.cells.kernels.record" not in modules  # a tool since issue 70
    into_tools = [
        f"{a} -> {b}"
        for a, targets in modules.items()
        if a.startswith("rhnzoo")
        for b in targets
        if b.split(".")[0] == "tools"
    ]
    assert not into_tools, into_tools


def test_no_import_runs_upward():
    upward = [
        f"{a} -> {b}"
        for a, targets in graph().items()
        for b in sorted(targets)
        if layer(a) is not None and layer(b) is not None and layer(b) > layer(a)
    ]
    assert not upward, upward


def test_no_module_imports_itself_through_others():
    # A package's __init__ only hands names on; edges into it would tie every submodule
    # that imports a sibling through it into a false circle.
    edges = {
        a: {
            b
            for b in targets
            if b != a
            and is_module(b)
            and not (ROOT.joinpath(*b.split(".")) / "__init__.py").is_file()
        }
        for a, targets in graph().items()
    }
    state, circles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not circles, circles
