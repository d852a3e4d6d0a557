"""The sections of ``sam-report``'s report.md, each registered where it is defined, like variants:
adding an analysis to the report is one module in ``sam_runner/results/`` that registers its
section::

    @SECTIONS.register("edge_of_stability", "λ_max against its stability threshold", order=40)
    def section(report, plots) -> list[str]: ...

A section is a function of the report (``sweep.Report``) and the figures written (paths) that
returns report.md's lines (none: the section is left out). Optional metadata: ``order`` (the
place in report.md, ascending), ``files`` (``files(report, out_dir) -> [paths]``: files it
writes beside report.md), ``csv_columns``/``csv_cells`` (columns it adds to report.csv: names,
and one group's cells).
"""

from __future__ import annotations

from ..registry import Registry

SECTIONS = Registry(
    "report section", "sam_runner.results", order=50, files=None, csv_columns=None, csv_cells=None
)


def figure(name: str, stem: str | None = None) -> str:
    """report.md's line for a figure file: a PNG shown in place; a PDF or SVG (plots.format)
    linked, as no Markdown viewer shows a PDF in place and many refuse SVG images."""
    stem = stem or name.rsplit(".", 1)[0]
    if name.lower().endswith(".png"):
        return f"![{stem}]({name})"
    return f"[{stem} ({name.rsplit('.', 1)[-1].upper()})]({name})"


def ordered() -> list:
    """Every section's entry, in report.md's order."""
    return sorted(SECTIONS.entries(), key=lambda e: (e.order, e.name))
