"""gpu_check.md: the figures of gpu_check.json as Markdown tables, ready for the README
(standard library only: the driver writes it after every part)."""

from __future__ import annotations

import math

CONFIG_NAMES = {
    "fp32": "fp32",
    "bf16": "bf16",
    "bf16_cl": "bf16 + channels_last",
    "bf16_cl_compile": "bf16 + channels_last + compile",
}


def num(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int) or abs(x) >= 10**digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def hours(h) -> str:
    """A GPU time: minutes under 1 h, else hours to 2 significant figures."""
    if h is None or not math.isfinite(h):
        return "–"
    return f"{h * 60:.0f} min" if h < 1 else f"{h:.2g} h" if h < 10 else f"{h:.0f} h"


def table(header: list, rows: list) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _result(results, name) -> dict:
    return (results["parts"].get(name) or {}).get("result") or {}


def head(results) -> list[str]:
    check, env = results["check"], _result(results, "env")
    gpu = env.get("gpu") or "no GPU (CPU dry run)"
    mem = f", {env['gpu_memory_gib']} GiB" if env.get("gpu_memory_gib") else ""
    commit = (check.get("commit") or "")[:10]
    lines = [
        f"## GPU check: {gpu}{mem}",
        "",
        f"{check['started']}, commit {commit or '?'}, {check['mode']} mode; "
        f"torch {env.get('torch', '?')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, "
        f"Python {env.get('python', '?')}; {num(check.get('seconds'))} s of a "
        f"{num(check['budget_s'])} s budget.",
        "",
    ]
    if check["mode"] == "cpu":
        lines += [
            "Dry run: every model is a stand-in (`model=cnn model.channels=8`) and the sizes are "
            "tiny; the figures check the code path, not anyone's speed.",
            "",
        ]
    wheels = results.get("wheels") or {}
    if wheels.get("wheels"):
        lines += [
            f"Carried wheels: {len(wheels['wheels'])} ({wheels.get('megabytes')} MiB), "
            f"install {wheels.get('status')}.",
            "",
        ]
    return lines


def parts(results) -> list[str]:
    rows = [
        [name, p.get("status", "?"), num(p.get("seconds")), (p.get("error") or "")[:160]]
        for name, p in results["parts"].items()
    ]
    return ["### Parts", "", *table(["part", "status", "s", "error"], rows), ""]


def cuda_tests(results) -> list[str]:
    r = _result(results, "cuda_tests")
    if not r:
        return []
    counts = ", ".join(f"{n} {k}" for k, n in sorted(r["counts"].items()))
    lines = ["### CUDA tests (`pytest -m cuda`)", "", counts + ".", ""]
    bad = [(n, t) for n, t in r["tests"].items() if t["outcome"] in ("failed", "error")]
    reasons = sorted({t["message"] for t in r["tests"].values() if t["outcome"] == "skipped"})
    lines += [f"- {t['outcome']}: `{n}`: {t['message']}" for n, t in bad]
    lines += [f"- skipped: {m}" for m in reasons]
    return lines + [""]


def _config_row(model, config, c) -> list:
    ips = c.get("images_per_s") or {}
    return [
        model,
        CONFIG_NAMES.get(config, config),
        num(ips.get("base")),
        num(ips.get("sam")),
        num(c.get("sam_over_base")),
        num(c.get("gear_sam_over_sam")),
        num(c.get("spectral_sam_over_sam")),
        num(c.get("eval_images_per_s")),
        num(c.get("peak_gib_sam")),
        num((c.get("first_step_s") or {}).get("sam")),
    ]


TRAIN_HEADER = [
    "model",
    "config",
    "base img/s",
    "SAM img/s",
    "SAM/base (≥ 2)",
    "GEAR-SAM/SAM",
    "spectral/SAM",
    "eval img/s",
    "peak GiB (SAM)",
    "1st SAM step s",
]


def training(results) -> list[str]:
    rows, batch = [], None
    for kind in ("train", "compile"):
        for name, p in results["parts"].items():
            r = p.get("result") or {}
            if name.startswith(kind + ":") and r.get("configs"):
                batch = r.get("batch")
                for config, c in r["configs"].items():
                    if kind == "train" or config == "bf16_cl_compile":
                        rows.append(_config_row(r["model"], config, c))
    models = _result(results, "models").get("models") or {}
    for model, configs in models.items():
        rows += [_config_row(model, config, c) for config, c in configs.items()]
    if not rows:
        return []
    title = f"### Training steps (CIFAR-100 files, batch {batch}, SGD base)"
    lines = [title, "", *table(TRAIN_HEADER, rows), ""]
    speed = [
        f"{(p.get('result') or {}).get('model')}: compile {num(c.get('compile_s'))} s, "
        f"SAM step {num(c.get('speedup_sam'))}× bf16 + channels_last"
        for name, p in results["parts"].items()
        if name.startswith("compile:")
        for c in [((p.get("result") or {}).get("configs") or {}).get("bf16_cl_compile") or {}]
        if c
    ]
    return lines + ([f"torch.compile: {'; '.join(speed)}.", ""] if speed else []) + modes(results)


def modes(results) -> list[str]:
    """Each trainer.compile_mode's compile time and SAM step against eager bf16 + channels_last."""
    rows = [
        [r.get("model"), mode, m.get("skipped") or num(m.get("compile_s")),
         num(m.get("speedup_sam")) if "skipped" not in m else "–"]
        for name, p in results["parts"].items() if name.startswith("compile:")
        for r in [p.get("result") or {}]
        for mode, m in (r.get("modes") or {}).items()
    ]  # fmt: skip
    header = ["model", "compile_mode", "compile s (first SAM step)", "SAM step speed-up"]
    return (
        ["### Compile modes (bf16 + channels_last)", "", *table(header, rows), ""] if rows else []
    )


def fast_path(f: dict | None) -> str:
    """A preset's resolved fast path in a few words (fast_path.describe's wording)."""
    if not f:
        return "–"
    on = [f"{f['precision']} autocast"] if f["precision"] != "fp32" else []
    on += [n for n, k in (("channels_last", "channels_last"), ("cudnn.benchmark",
           "cudnn_benchmark"), ("compile", "compile")) if f.get(k)]  # fmt: skip
    return ", ".join(on) or "fp32 eager"


def curvature(results) -> list[str]:
    rows = []
    for name, p in results["parts"].items():
        r = p.get("result") or {}
        if name.startswith("curvature:") and r:
            rows.append(
                [
                    r.get("model"),
                    num(r.get("hvp_over_grad")),
                    r.get("hvp_method", "–"),
                    num(r.get("lambda_max_s")),
                    f"{num(r.get('lambda_max_hvps'))} + {num(r.get('lambda_max_presolve_hvps'))}",
                    num(r.get("hessian_num_samples")),
                ]
            )
    header = ["model", "HVP/gradient", "HVP method", "λ_max s", "HVPs (+ presolve)", "samples"]
    return ["### Curvature (fp32)", "", *table(header, rows), ""] if rows else []


def host(results) -> list[str]:
    """The host's work per step (a tiny model) and the synchronising calls per step."""
    r = _result(results, "host")
    if not r:
        return []
    rows = [
        [f"`{key}`", num(r.get(key)), num(r[f"{key}_us_per_step"]["ours"]),
         num(r[f"{key}_us_per_step"]["bare"])]
        for key in ("host_step_over_bare", "host_sam_over_davda54")
        if r.get(f"{key}_us_per_step")
    ]  # fmt: skip
    lines = ["### Host work per step (one Linear layer)", ""]
    lines += table(["figure", "ratio", "ours µs/step", "bare µs/step"], rows)
    syncs = r.get("syncs_per_step")
    if syncs:
        lines += ["", "Synchronising calls per step (CUDA sync debug mode): "
                  + ", ".join(f"{v} {num(n)}" for v, n in syncs.items())]  # fmt: skip
    return [*lines, ""]


def presets(results) -> list[str]:
    r = _result(results, "estimates")
    if not r.get("presets"):
        return []
    rows = [
        [
            f"`{name}`",
            e["jobs"],
            hours(e.get("fp32_gpu_h")),
            hours(e.get("bf16_cl_gpu_h")),
            " – ".join(hours(h) for h in e["fp32_job_h"]) if e.get("fp32_job_h") else "–",
            e.get("not_estimated")
            or ", ".join(e["missing"])
            or ("" if e["lambda_max_included"] else "λ_max time"),
            fast_path(e.get("fast_path")),
        ]
        for name, e in r["presets"].items()
    ]
    header = [
        "preset",
        "jobs",
        "GPU time (fp32)",
        "bf16 + channels_last",
        "one job",
        "not measured",
        "fast path here",
    ]
    note = (
        "Extrapolated from the figures below (scripts/gpu_presets.py, docs/gpu_check.md): per "
        "job, epochs × steps per epoch × seconds per step + its evaluations + one λ_max."
    )
    return ["### Study presets on one such GPU", "", *table(header, rows), "", note, ""]


def write_markdown(results: dict) -> str:
    lines = head(results)
    for section in (presets, training, host, curvature, cuda_tests, parts):
        lines += section(results)
    return "\n".join(lines).rstrip() + "\n"
