"""The layout rules of docs/architecture.md, checked on the source tree.

- No import cycle between bladepack's packages, nor between its modules (imports under TYPE_CHECKING
  and inside functions count: a cycle in the types is a cycle in the design).
- Each package imports only what the layer table allows (`ALLOWED`, the table in the doc).
- No source under bladepack/ or cpp_runtime/ (Python, C, C++, CUDA) is longer than 600 lines.
"""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "bladepack"
CPP_ROOT = ROOT.parent / "cpp_runtime"
MAX_LINES = 600
NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh")

LEAVES = {"errors", "dtypes", "dims", "version", "cpu_features", "options", "progress", "opset", "private_files"}
# package -> the packages it may import (leaf modules listed in LEAVES are importable by all)
ALLOWED: dict[str, set[str]] = {
    **{leaf: set() for leaf in LEAVES},
    "target": set(),
    "ir": set(),
    "artifact": set(),
    "loader": {"artifact"},
    "export": {"ir"},
    "onnx_import": {"ir"},
    "passes": {"ir", "target"},
    "codegen": {"ir", "target"},
    "library_ops": {"ir", "codegen", "loader", "target"},
    "backends": {"ir", "codegen", "library_ops", "loader", "target"},
    "lowering": {"ir", "passes", "codegen", "library_ops", "backends", "artifact", "target"},
    "inspect": {"artifact"},
    "reference_record": {"artifact"},
    "compiled": {"artifact", "lowering"},
    "packed_build": {"artifact", "compiled", "ir", "loader", "passes", "target"},
    "stages": {
        "backends",
        "compiled",
        "inspect",
        "ir",
        "library_ops",
        "loader",
        "lowering",
        "packed_build",
        "passes",
        "reference_record",
        "target",
    },
    "api": {"compiled", "export", "ir", "onnx_import", "passes", "reference_record", "stages", "target"},
    "extend": {"api", "artifact", "ir", "loader", "reference_record", "target"},
    "onnx_backend": {"api", "loader"},
    "serving": {"artifact", "loader"},
    "cli": {"api", "artifact", "extend", "inspect", "loader", "serving"},
    "__init__": {"api", "loader"},
    "__main__": {"cli"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The package (or top-level module) a dotted bladepack module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> set[str]:
    """Every bladepack module `path` names in an import, wherever the import stands."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m == "bladepack" or m.startswith("bladepack.")}


def package_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> imported unit -> the modules that import it (self-imports left out)."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(ROOT.rglob("*.py")):
        src = _unit(_module_name(path))
        for target in _imports(path):
            dst = _unit(target)
            if dst != src and target != "bladepack":
                graph[src][dst].append(_module_name(path))
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle of units (first unit repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, {})):
            if state.get(v) == 1:
                return [*stack[stack.index(v) :], v]
            if v not in state:
                found = visit(v)
                if found:
                    return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state:
            found = visit(u)
            if found:
                return found
    return None


def test_no_package_cycles() -> None:
    graph = package_graph()
    cycle = find_cycle(graph)
    assert cycle is None, (
        "package import cycle: "
        + " -> ".join(cycle)
        + "".join(f"\n  {a} -> {b}: {', '.join(sorted(set(graph[a][b])))}" for a, b in itertools.pairwise(cycle))
    )


def test_cycle_finder_sees_cycles() -> None:
    """The check above can fail: a two-package and a three-package cycle are reported."""
    assert find_cycle({"a": {"b": ["m"]}, "b": {"a": ["n"]}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "d": {"c": []}}) is None


def test_layer_table() -> None:
    """Each package imports only the layers below it (docs/architecture.md)."""
    graph = package_graph()
    unknown = sorted(set(graph) - set(ALLOWED))
    assert not unknown, f"packages missing from the layer table (add them to docs/architecture.md too): {unknown}"
    bad = [
        f"{src} -> {dst} ({', '.join(sorted(set(mods)))})"
        for src, targets in sorted(graph.items())
        for dst, mods in sorted(targets.items())
        if dst not in ALLOWED[src] and dst not in LEAVES
    ]
    assert not bad, "imports the layer table does not allow:\n  " + "\n  ".join(bad)


def _sources() -> list[Path]:
    python = sorted(ROOT.rglob("*.py"))
    native = sorted(p for base in (ROOT, CPP_ROOT) for p in base.rglob("*") if p.suffix in NATIVE_SUFFIXES)
    return python + native


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_file_length(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT.parent)} has {lines} lines; split it (at most {MAX_LINES})"


def module_graph() -> dict[str, set[str]]:
    """module -> the bladepack modules it imports, wherever the import stands. `from p import x` names
    the module p.x when p.x is a module, else p itself (a package's __init__)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}

    def owner(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named: list[str] = []
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                named = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
            for name in named:
                if name == "bladepack" or name.startswith("bladepack."):
                    dst = owner(name)
                    if dst != module:
                        graph[module].add(dst)
    return graph


def test_no_module_cycles() -> None:
    graph = module_graph()
    cycle = find_cycle({m: {t: [] for t in targets} for m, targets in graph.items()})
    assert cycle is None, "module import cycle: " + " -> ".join(cycle)


def test_environment_read_in_options_only() -> None:
    """Every knob goes through bladepack/options.py (Options, Toolchains, LoaderOptions)."""
    readers = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "options.py" and path.parent == ROOT:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and _is_os(node.value):
                readers.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not readers, "environment read outside options.py: " + ", ".join(readers)


def _is_os(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "os"


COMPILE_SIDE = (
    "passes",
    "lowering",
    "codegen",
    "library_ops",
    "ir",
    "stages.py",
    "api.py",
    "extend.py",
    "packed_build.py",
)


def test_no_target_names_compared_on_the_compile_side() -> None:
    """The compile side asks the backends (bladepack/backends) what they do; it never compares a plan
    kind's name ("cpu", "cuda"). Parsing `targets` (target.py) and the backends themselves may."""
    found = []
    for part in COMPILE_SIDE:
        base = ROOT / part
        for path in sorted(base.rglob("*.py") if base.is_dir() else [base]):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Compare):
                    operands = [node.left, *node.comparators]
                    names = [o.value for o in operands if isinstance(o, ast.Constant) and o.value in ("cpu", "cuda")]
                    if names:
                        found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} compares with {names[0]!r}")
    assert not found, "target names compared on the compile side:\n  " + "\n  ".join(found)


def test_an_elementwise_op_is_named_in_few_places() -> None:
    """Note [Adding an elementwise op] (opset/table.py): `erf`, standing in for any elementwise op, is
    named only by the op table, the two front ends' mappings, the two preludes' vectorizable spellings
    and the C++ runtime's generated op list."""
    import re

    word = re.compile(r"\berf\b", re.IGNORECASE)
    files = sorted(
        str(p.relative_to(ROOT.parent))
        for base in (ROOT, CPP_ROOT)
        for p in base.rglob("*")
        if p.is_file() and p.suffix in (".py", *NATIVE_SUFFIXES) and word.search(p.read_text())
    )
    assert len(files) <= 6, files
    assert "bladepack/opset/table.py" in files, files


def test_every_option_has_a_knob() -> None:
    """Every field of the options classes is set by one environment variable of KNOBS (the table
    docs/configuration.md is generated from), and nothing else."""
    import dataclasses

    from bladepack.options import KNOBS, CompileOptions, LoaderOptions, ServeOptions

    for group, cls in (("compile", CompileOptions), ("loader", LoaderOptions), ("serve", ServeOptions)):
        fields = [f.name for f in dataclasses.fields(cls)]
        knobs = [k.field for k in KNOBS if k.group == group]
        assert sorted(fields) == sorted(knobs), (cls.__name__, set(fields) ^ set(knobs))


def test_generated_files_are_current() -> None:
    """cpp_runtime/src/plan_ops.h (from the op table) and docs/configuration.md (from KNOBS) are what
    scripts/generate.py writes: run it after changing either table."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate", ROOT.parent / "scripts" / "generate.py")
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    stale = [rel for rel, make in generate.GENERATED.items() if (ROOT.parent / rel).read_text() != make()]
    assert not stale, f"stale generated files (run python scripts/generate.py): {stale}"
