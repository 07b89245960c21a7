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
