"""sam-report's sharpness-dimension section: the lines by (variant, batch size) over η, the mean
over seeds, the table of the points, the figure written, and no section without the key."""

from __future__ import annotations

from test_measures_report import job

from sam_runner.results.measure_ranking import points_of
from sam_runner.results.report import build_report, write_report
from sam_runner.results.sharpness_dim import lines_by_step


def test_lines_are_the_seed_means_by_step_and_batch_size(tmp_path):
    n = 0
    for batch in ("full", "32"):
        for lr in ("0.2", "0.1"):
            for seed in (0, 1):
                dim = float(lr) * 100 + (batch == "32") * 7 + seed
                ov = [
                    "optimizer=base",
                    f"dataset.batch_size={batch}",
                    f"base_optimizer.lr={lr}",
                    f"seed={seed}",
                ]
                job(
                    tmp_path,
                    n,
                    ov,
                    {"test_acc": 0.8},
                    {
                        "status": "completed",
                        "sharpness_dim": dim,
                        "gen_gap": 0.01 * seed,
                        "test_acc": 0.8,
                    },
                )
                n += 1
    report = build_report(tmp_path)
    lines = lines_by_step(points_of(report))
    assert lines[("base", "full")] == [(0.1, 10.5, 2), (0.2, 20.5, 2)]
    assert lines[("base", "32")] == [(0.1, 17.5, 2), (0.2, 27.5, 2)]
    write_report(report)
    text = (tmp_path / "report.md").read_text()
    assert "## Sharpness dimension" in text and "over 8 jobs" in text
    # the table: seed means ± std per (variant, batch size, η), rows by batch size then η
    assert "| base | 32 | 0.1 | 17.5 ± 0.71 | — | 0.005 ± 0.0071 | — | 2 |" in text
    assert text.index("| base | 32 | 0.2 | 27.5 ± 0.71 |") < text.index(
        "| base | full | 0.1 | 10.5"
    )
    assert (tmp_path / "sharpness_dim.png").stat().st_size > 10_000


def test_no_section_without_the_key(tmp_path):
    for n in range(3):
        job(
            tmp_path,
            n,
            ["optimizer=base", f"seed={n}"],
            {"test_acc": 0.8},
            {"status": "completed", "lambda_max": 1.0 + n, "gen_gap": 0.1, "test_acc": 0.8},
        )
    write_report(build_report(tmp_path))
    assert "Sharpness dimension" not in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "sharpness_dim.png").exists()
