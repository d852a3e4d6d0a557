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


def _module_name(path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, name: str, known: set) -> set:
    """The package's modules ``path`` imports, at any level (inside functions too: an import
    deferred into a function hides a cycle, it does not remove it)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        out |= {t for t in targets if t in known}
    return out - {name}


def import_graph(root_package: str = "sam_runner") -> dict:
    paths = {_module_name(p): p for p in (ROOT / root_package).rglob("*.py")}
    return {n: _imports(p, n, set(paths)) for n, p in paths.items()}


def cycles_through(graph: dict, prefix: str) -> list[list[str]]:
    """Import cycles that pass through a module whose name starts with ``prefix``."""
    found = []
    for start in (n for n in graph if n.startswith(prefix)):
        stack = [(start, [start])]
        seen = set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    found.append(trail)
                elif nxt not in seen and not nxt.endswith("__init__"):
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "sam_runner.rundir" in graph
    cycles = cycles_through(graph, "sam_runner")
    assert not cycles, [" -> ".join(c) for c in cycles[:5]]


# The package's floors, lowest first (a module's floor is its top-level name under sam_runner):
# a module imports its own floor or the ones below, never one above. The ground holds what every
# command reads (errors, settings, the run folder's owner, the words every command spells the
# same); the parts are what a run is built
# from, and the figures drawn from files; then the trainer; then what launches training jobs;
# then the analysis commands; then the front doors.
FLOORS = (
    {"errors", "settings", "rundir", "runfiles", "registry", "clock", "paths", "lock", "progress"}
    | {"module_state", "distributed", "cli_words", "help", "interrupts", "part", "yaml_alike"}
    | {"activation_checkpointing"},
    {"data", "models", "optim", "metrics", "losses", "samplers", "schedulers", "averaging"}
    | {"regularizers", "weight_decay", "distill", "adapters", "circuits"}
    | {"loggers", "provenance", "plots"},
    {"validate", "idle_periods", "train", "training", "rebuild", "federated", "integrations"},
    {"sweep", "preflight", "jobarray", "command_config"},
    {"evaluation", "landscape", "results"},
    {"cli", "entry_points"},
)


def floor_of(module: str) -> int | None:
    """The floor of ``sam_runner.X...`` (None for the package itself)."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    found = [i for i, names in enumerate(FLOORS) if parts[1] in names]
    assert found, f"{module} is on no floor: add sam_runner.{parts[1]} to FLOORS"
    return found[0]


def upward_imports(graph: dict) -> list[str]:
    return [
        f"{a} -> {b}"
        for a, targets in sorted(graph.items())
        for b in sorted(targets)
        if floor_of(a) is not None and floor_of(b) is not None and floor_of(b) > floor_of(a)
    ]


def test_no_module_imports_a_higher_floor():
    assert upward_imports(import_graph()) == []


def test_the_floor_check_finds_an_upward_import():
    graph = {"sam_runner.rundir": {"sam_runner.train"}, "sam_runner.train": {"sam_runner.rundir"}}
    assert upward_imports(graph) == ["sam_runner.rundir -> sam_runner.train"]


def test_the_cycle_check_finds_a_cycle():
    graph = {"sam_runner.results.a": {"sam_runner.b"}, "sam_runner.b": {"sam_runner.results.a"}}
    assert cycles_through(graph, "sam_runner.results") == [["sam_runner.results.a", "sam_runner.b"]]


# third-party packages whose private names (a module path part or a name starting with "_") only
# sweep/hydra_api.py may use: an upgrade of one of them is a change to that module alone
GUARDED = ("hydra", "optuna", "submitit")  # the search is on Optuna's public API alone
PRIVATE_NAMES_OWNER = ROOT / "sam_runner" / "sweep" / "hydra_api.py"


def _guarded(module: str) -> bool:
    parts = module.split(".")
    if parts[0] == "hydra_plugins":  # other plugins' private parts; ours is the package's own
        return len(parts) > 1 and parts[1] != "sam_runner_sweeper"
    return parts[0] in GUARDED


def private_uses(path) -> list[str]:
    """Imports of a guarded package's private names in ``path``, and ``x._name`` where ``x`` is
    a name imported from a guarded package."""
    tree, found, imported = ast.parse(path.read_text()), [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs = [
                (a.name, a.asname or a.name.split(".")[0], a.name.split(".")) for a in node.names
            ]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            pairs = [
                (node.module, a.asname or a.name, [*node.module.split("."), a.name])
                for a in node.names
            ]
        else:
            continue
        for module, bound, parts in pairs:
            if _guarded(module):
                imported.add(bound)
                if any(p.startswith("_") for p in parts):
                    found.append(f"{path.name}:{node.lineno} imports {'.'.join(parts)}")
    for node in ast.walk(tree):
        attr = getattr(node, "attr", "")
        if attr.startswith("_") and not attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in imported:
                found.append(f"{path.name}:{node.lineno} uses {base.id}...{attr}")
    return found


def test_private_third_party_names_live_in_hydra_api_alone():
    files = [*(ROOT / "sam_runner").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")]
    hits = [h for p in files if p != PRIVATE_NAMES_OWNER for h in private_uses(p)]
    assert hits == []
    assert private_uses(PRIVATE_NAMES_OWNER)  # the check sees them where they are


def test_the_private_name_check_finds_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import submitit\nfrom hydra._internal.utils import x\nsubmitit.A._p()\n")
    assert private_uses(module) == [
        "m.py:2 imports hydra._internal.utils.x",
        "m.py:3 uses submitit..._p",
    ]


# the run folder's file and folder names: spelled in its owner module, sam_runner/rundir.py, alone
RUN_FOLDER_NAMES = (
    "summary.json",
    "metrics.jsonl",
    "eval.json",
    "eval_averaged.json",
    "last.pt",
    "averaged.pt",
    "landscape.json",
    "overrides.yaml",
    ".hydra",
)


def literal_run_folder_names(path) -> list[str]:
    """``file:line 'literal'`` for each short string literal of ``path`` naming a run-folder file
    (docstrings and prose are longer, and may name them)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 40:
            if any(name in node.value for name in RUN_FOLDER_NAMES):
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    return hits


def test_run_folder_names_are_spelled_in_the_owner_module_alone():
    owner = ROOT / "sam_runner" / "rundir.py"
    assert literal_run_folder_names(owner), "rundir.py should name the files"
    hits = [
        hit
        for p in sorted((ROOT / "sam_runner").rglob("*.py"))
        if p != owner
        for hit in literal_run_folder_names(p)
    ]
    assert not hits, hits
