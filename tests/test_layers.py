"""The house rules, checked: imports run down the layers of pyproject's [tool.importlinter]
contracts with no cycle, no traingym import hides inside a function unless a heavy
third-party import is the reason (a `# heavy: <package>` comment on the line), and the
package's top level holds only the entry points."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "traingym"


def test_import_layers_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_no_import_cycles_among_traingym_modules():
    import grimp

    graph = grimp.build_graph("traingym", cache_dir=None)
    cycles = []
    for m in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(m):
            if graph.chain_exists(importer=imported, imported=m):
                cycles.append((m, imported))
    assert not cycles, cycles[:10]


def _function_imports(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for st in ast.walk(node):
            names = ([st.module or ""] if isinstance(st, ast.ImportFrom)
                     else [a.name for a in st.names] if isinstance(st, ast.Import) else [])
            if any(n.startswith("traingym") for n in names):
                if "# heavy:" not in lines[st.lineno - 1]:
                    out.append(f"{path.relative_to(ROOT)}:{st.lineno}")
    return out


def test_no_traingym_import_inside_a_function_without_a_heavy_reason():
    found = [hit for p in sorted(PKG.rglob("*.py")) for hit in _function_imports(p)]
    assert not found, f"{len(found)} function-level imports: {found[:20]}"


def test_top_level_holds_only_entry_points_and_packages():
    files = sorted(p.name for p in PKG.iterdir() if p.is_file() and p.suffix in (".py", ".c"))
    assert files == ["__init__.py", "api.py", "cli.py"], files
