"""The codebase's own rules: short functions, references inside the repository, one registry."""

from __future__ import annotations

import ast
import re

from conftest import ROOT

MAX_FUNCTION_LINES = 60


def functions(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_function_in_the_package_is_longer_than_60_lines():
    long = [
        f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)"
        for p in sorted((ROOT / "sam_runner").rglob("*.py"))
        for name, line, n in functions(p)
        if n > MAX_FUNCTION_LINES
    ]
    assert not long, long


# paths of the planning material beside the repository, and the way its notes refer to it
OUTSIDE = re.compile(
    r"spec/variants\.md|spec/contract\.md|shared/|seed abstract|the issue\b|the contract\b",
    re.IGNORECASE,
)


def test_code_and_docs_point_only_inside_the_repository():
    files = [
        *(ROOT / "sam_runner").rglob("*.py"),
        *(ROOT / "conf").rglob("*.yaml"),
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "scripts").glob("*"),
        *(p for p in (ROOT / "tests").rglob("*.py") if p.name != "test_structure.py"),
        ROOT / "README.md",
        ROOT / "pyproject.toml",
    ]
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in files
        if p.is_file()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, hits
