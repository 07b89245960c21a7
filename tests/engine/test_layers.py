"""Imports run one way: reference, planner -> optimized -> conformance -> bench, reports -> kernel_lab
(the CLI). A module may import its own layer or a lower one, never a higher one; the check reads
every import statement of the product's modules, those inside functions included."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYER = {"reference": 0, "planner": 0, "optimized": 1, "conformance": 2, "bench": 3, "reports": 3,
         "kernel_lab": 4}


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in the module at ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def upward_imports(package: str) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} imports {top}"
            for path in sorted((ROOT / package).rglob("*.py"))
            for line, top in imported(path) if LAYER.get(top, -1) > LAYER[package]]


@pytest.mark.parametrize("package", list(LAYER))
def test_no_import_from_a_higher_layer(package):
    assert upward_imports(package) == []


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from bench import registry\n    import kernel_lab.cli\n")
    assert imported(module) == [(2, "bench"), (3, "kernel_lab")]


def test_every_product_package_has_a_layer():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - {"tests"} == set(LAYER)


# Inside conformance: the core (cells, compare, numerics...) -> families -> the registry and its backends ->
# the inputs from files and models -> the run engine (conformance/run/) -> what drives a run (the pytest
# plugin, the planted-bug helpers, the audit, studies). Longest prefix wins; "" is the core.
CONFORMANCE_LAYER = {"": 0, "inputs.checks": 0, "inputs.tensor_files": 0, "inputs.capture": 0, "families": 1,
                     "registry": 2, "backends": 2, "inputs": 3, "run": 4, "pytest_plugin": 5, "testing": 5,
                     "audit": 5, "studies": 5, "relations": 5, "turboquant_relations": 5,
                     "relation_verdicts": 5}


def conformance_layer(module: str) -> int:
    """The layer of ``conformance.<module>`` (a dotted path inside the package)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in CONFORMANCE_LAYER:
            return CONFORMANCE_LAYER[".".join(parts[:n])]
    return CONFORMANCE_LAYER[""]


def conformance_imports(path: Path, root: Path = ROOT / "conformance") -> list[tuple[int, str]]:
    """(line, dotted path inside conformance) of every import of a conformance module at ``path``
    (``from conformance.pkg import x`` names the module pkg.x when x is a module of ``root``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name[len("conformance."):]) for a in node.names if a.name.startswith("conformance.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module != "conformance" and not node.module.startswith("conformance."):
                continue
            package = node.module[len("conformance."):]
            for a in node.names:
                inner = f"{package}.{a.name}".lstrip(".")
                folder = root.joinpath(*inner.split("."))
                is_module = folder.with_suffix(".py").exists() or folder.is_dir()
                out.append((node.lineno, inner if is_module else package))
    return out


def test_conformance_layers_run_one_way():
    root = ROOT / "conformance"
    wrong = []
    for path in sorted(root.rglob("*.py")):
        here = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix("__init__").rstrip(".")
        for line, module in conformance_imports(path):
            if conformance_layer(module) > conformance_layer(here):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports conformance.{module}")
    assert wrong == []


def test_the_conformance_check_sees_an_engine_import_from_a_backend(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from conformance import fingerprint\nfrom conformance.run import records\n"
                      "from conformance.run.records import Writer\n")
    assert conformance_imports(module) == [(1, "fingerprint"), (2, "run.records"), (3, "run.records")]
    assert conformance_layer("backends.m") < conformance_layer("run.records")
