"""The documentation's references hold: every relative link in README.md and docs/*.md points
at a file or folder of the repository, every #anchor names a heading of the page it points into
(as GitHub forms anchors), and every repository path quoted in code spans exists."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# repository paths quoted in code spans: top-level folders of the repository
REPO_PATH = re.compile(r"^(sam_runner|conf|tests|scripts|docs|hydra_plugins)/[\w./-]*$")


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield i, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (github-slugger): the rendered text lowercased, every
    character but letters, numbers, marks, '_', '-' and spaces dropped, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    parts = CODE_SPAN.split(text)  # [prose, ticks, code, prose, ...]: code renders literally
    text = "".join(
        part if i % 3 == 2 else re.sub(r"<[^>]+>", "", part).replace("*", "")
        for i, part in enumerate(parts)
        if i % 3 != 1
    )
    text = text.strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives a markdown file: its headings' slugs (repeats numbered -1, -2,
    ...) and explicit HTML ids and names."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text()):
        m = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
        out.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
    return out


def links(path: Path):
    """(line number, target) of every link in prose, code spans excepted."""
    for i, line in prose_lines(path.read_text()):
        for m in LINK.finditer(CODE_SPAN.sub("", line)):
            yield i, m.group(1)


def test_slug_follows_github():
    assert slug("Results: Weights & Biases, run plots") == "results-weights--biases-run-plots"
    assert slug("SAM variants (`optimizer=<name>`)") == "sam-variants-optimizername"
    assert slug("spectral_sam on a CPU ResNet-18") == "spectral_sam-on-a-cpu-resnet-18"
    assert slug("metrics.jsonl") == "metricsjsonl"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_and_anchors_resolve(doc):
    bad = []
    for line, target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.is_relative_to(ROOT):
            bad.append(f"{doc.name}:{line}: {target} points outside the repository")
        elif not dest.exists():
            bad.append(f"{doc.name}:{line}: {target} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{doc.name}:{line}: {target}: no heading with anchor #{anchor}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_repository_paths_in_code_spans_exist(doc):
    bad = [
        f"{doc.name}:{line}: `{span}`"
        for line, text in prose_lines(doc.read_text())
        for _, span in CODE_SPAN.findall(text)
        if REPO_PATH.match(span.strip()) and not (ROOT / span.strip()).exists()
    ]
    assert not bad, "\n".join(bad)


def test_the_python_example_of_the_variants_page_runs_and_steps():
    """docs/variants.md#from-python, run as written on a small model: one step changes the
    weights, and the loss it returns is the loss at θ."""
    import torch

    text = (ROOT / "docs" / "variants.md").read_text()
    section = text[text.index("## from Python") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x, y = torch.randn(16, 5), torch.randint(0, 3, (16,))
    loss_fn = torch.nn.functional.cross_entropy
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        at_theta = loss_fn(model(x), y)
    scope = {"torch": torch, "model": model, "loss_fn": loss_fn, "x": x, "y": y}
    exec(compile(code, "docs/variants.md", "exec"), scope)
    assert torch.equal(scope["loss"], at_theta)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def flat(path: Path) -> str:
    """A page's text with its line breaks as spaces (a phrase may wrap)."""
    return " ".join(path.read_text().split())


def test_the_readme_gives_the_curvature_subset_with_its_cap_at_the_training_set():
    """The README's subset size is the config's, and says it is capped: the default run on
    MNIST-1D measures on all of its training set, fewer samples than the setting."""
    from conftest import compose

    cfg = compose()
    size = cfg.metrics.hessian.num_samples
    train = round(cfg.dataset.num_samples * 0.8)  # MNIST-1D's split, 80/20
    readme = flat(ROOT / "README.md")
    assert f"subset of {size:,} training samples" in readme
    assert f"capped at the training set: all {train:,} of MNIST-1D's" in readme
    assert f"on {train} training samples (metrics.hessian.*)" in readme  # the run's own line


def test_running_md_describes_the_edge_of_stability_figure_curves_png_draws():
    """Each line the step-tracked curves figure draws is named in running.md's run plots, and
    nothing it does not draw is (no λ_max·η/2 panel)."""
    from sam_runner.plots.run import plot_eos

    rows = [
        {
            "epoch": s,
            "step": s,
            "lambda_max": 1.0 + s,
            "eos_threshold": 10.0,
            "sam_edge": 5.0,
            "armijo_curvature": 2.0,
            "step_loss": 1.0 / s,
        }
        for s in range(1, 6)
    ]
    fig = plot_eos(rows, "t")
    labels = [label for ax in fig.axes for label in ax.get_legend_handles_labels()[1]]
    page = flat(ROOT / "docs" / "running.md")
    text = page[page.index("**Run plots**") : page.index("**Figure format**")]
    for words in ("stability threshold", "SAM edge", "Armijo-probe curvature"):
        assert any(words in label for label in labels) and words in text
    assert len(fig.axes) == 2 and "η/2" not in text and "the loss on the same steps" in text


def test_extending_md_lists_every_registry():
    """Each module-level ``Registry(...)`` of the package has its row in extending.md's table."""
    import ast

    names = set()
    for path in (ROOT / "sam_runner").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "Registry"
            ):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    assert len(names) >= 13, names
    text = (ROOT / "docs" / "extending.md").read_text()
    missing = sorted(n for n in names if f"| `{n}` |" not in text)
    assert not missing, f"docs/extending.md's registry table lacks {missing}"


def test_the_readme_is_a_users_page_of_at_most_250_lines():
    """Measurement diaries belong in docs/benchmarks.md: the README stays short and undated."""
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a dated measurement in the README"


def test_running_md_names_every_search_preset_and_every_checkpoint_file():
    """#58 item 11: running.md left out hparams_search=sam_acc_vs_sharpness and
    checkpoints/init.pt."""
    from sam_runner import rundir

    page = (ROOT / "docs" / "running.md").read_text()
    groups_row = next(x for x in page.splitlines() if x.startswith("| `hparams_search` |"))
    for preset in sorted((ROOT / "conf" / "hparams_search").glob("*.yaml")):
        assert f"`{preset.stem}`" in groups_row, preset.stem
    folder_rows = [x for x in page.splitlines() if x.startswith("| `checkpoints/")]
    for path in (rundir.CHECKPOINT, rundir.AVERAGED, rundir.INIT_WEIGHTS):
        assert any(x.startswith(f"| `{path}` |") for x in folder_rows), path


def test_the_readmes_default_run_prints_its_figures_as_print_final_does(capsys):
    """#58 item 8: the closing line prints the digits a run reproduces across CPUs (three), and
    the README shows it as printed, with what varies said beside it."""
    from sam_runner.progress import print_final

    readme = (ROOT / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("completed: test_acc="))
    values = dict(re.findall(r"(\w+)=([0-9.]+)", line))
    summary = {"status": "completed", **{k: float(v) for k, v in values.items()}}
    print_final(summary, "/path/to/outputs/default")
    assert capsys.readouterr().out.strip() == line
    assert values["test_acc"] == "0.982" and values["lambda_max"] == "12.2"
    assert "The last digits differ between machines" in readme


def test_the_readme_says_how_a_cpu_only_machine_installs():
    """#58 item 7: PyTorch's CPU wheels first (its documented index), and how long it takes."""
    readme = (ROOT / "README.md").read_text()
    top = readme.split("```")[1]
    cpu = next(x for x in top.splitlines() if "download.pytorch.org/whl/cpu" in x)
    assert cpu.startswith("pip install torch torchvision --index-url https://download.pytorch.org")
    assert top.index(cpu) < top.index("pip install -e .")
    said = " ".join(readme.split("```")[2].strip().split("\n\n")[0].split())
    assert said.startswith("The install takes minutes") and "6 GB" in said and "2.4 GB" in said


def test_user_pages_state_what_is_true_now_undated():
    """A measurement's date, machine and load live in docs/benchmarks.md's history alone; the
    other pages say what holds now."""
    import re

    diary = re.compile(
        r"\b20\d\d-\d\d-\d\d\b|loaded by other|other work shar|shared with other work"
    )
    pages = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "benchmarks.md"]
    found = [
        f"{p.name}:{i}: {line.strip()}"
        for p in pages
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if diary.search(line)
    ]
    assert not found, found
