"""One prepared check of sam-runner's whole CUDA path, sized for a single 10-minute call on a
lent GPU (docs/gpu_check.md says what each figure is).

    bash scripts/fetch_gpu_wheels.sh          # here: the missing packages as wheels, into .whl/
    python3 scripts/gpu_check.py $OUT         # there: everything into one folder
    python scripts/gpu_check.py out --cpu     # here: the dry run (same parts, tiny sizes)

It installs the carried wheels (``.whl/``, into ``--site``, then on PYTHONPATH), then runs each
part in its own process (scripts/gpu_parts.py, or pytest for the CUDA tests) under a per-part
timeout and a global budget: a part that fails, crashes or times out is recorded and the rest
still runs; a part the budget cannot fit is recorded as skipped. After every part it rewrites
gpu_check.json (everything) and gpu_check.md (tables for the README); gpu_check.log holds every
part's output. This driver needs the standard library alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))

from gpu_report import write_markdown  # noqa: E402 (the scripts folder first)


@dataclass(frozen=True)
class PartSpec:
    name: str
    gpu_s: int  # its timeout on a GPU
    cpu_s: int  # ... and in the dry run


# in order of value: what a cut budget drops is at the end (estimates run last, on what exists)
PARTS = (
    PartSpec("env", 60, 60),
    PartSpec("data", 60, 60),
    PartSpec("cuda_tests", 180, 120),
    PartSpec("host", 60, 45),  # host work per step (a tiny model), syncs per step
    PartSpec("train:resnet18", 90, 90),
    PartSpec("train:wrn16_8", 120, 90),
    PartSpec("curvature:resnet18", 60, 60),
    PartSpec("sharded", 120, 60),  # FSDP and activation checkpointing (bench_fsdp and more)
    PartSpec("curvature:wrn16_8", 90, 60),
    PartSpec("models", 120, 90),
    # the longest and likeliest to fail: last; three compile modes each (default first)
    PartSpec("compile:resnet18", 300, 90),
    PartSpec("compile:wrn16_8", 300, 90),
    PartSpec("estimates", 45, 60),
)
ALWAYS = ("env", "data", "estimates")
RESERVE_S = 30  # kept back for the estimates and the last report
MIN_PART_S = 15  # a part given less than this is skipped


def parse(argv):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("out", nargs="?", default=os.environ.get("OUT") or "gpu_check_out")
    ap.add_argument("--cpu", action="store_true", help="dry run without CUDA, tiny sizes")
    ap.add_argument("--budget", type=float, help="seconds for the whole check (GPU 470, CPU 300)")
    ap.add_argument(
        "--wheels",
        type=Path,
        help="folder of wheels to install first (default .whl/ on a GPU; none in the dry run)",
    )
    ap.add_argument("--site", type=Path, default=Path("/tmp/site"), help="where wheels go")
    ap.add_argument("--only", nargs="*", help="these parts alone (env, data, estimates always)")
    args = ap.parse_args(argv)
    if args.wheels is None and not args.cpu:
        args.wheels = ROOT / ".whl"
    args.budget = args.budget or (300.0 if args.cpu else 470.0)
    return args


class Check:
    def __init__(self, args):
        self.args, self.out = args, Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self.log = self.out / "gpu_check.log"
        self.log.write_text("")
        self.start = time.monotonic()
        self.pythonpath = [str(ROOT), str(SCRIPTS)]
        self.results = {
            "check": {
                "mode": "cpu" if args.cpu else "gpu",
                "budget_s": args.budget,
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "commit": _commit(),
            },
            "wheels": {},
            "parts": {},
        }

    # ------------------------------------------------------------------ running
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def env(self) -> dict:
        path = os.pathsep.join([*self.pythonpath, os.environ.get("PYTHONPATH", "")]).rstrip(":")
        return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}

    def run(self, cmd: list, timeout: float, title: str) -> tuple[int | None, str]:
        """``cmd`` in its own process group (killed whole at the timeout: pytest's and DDP's
        children too), its output appended to the log; (exit code or None on timeout, tail)."""
        with open(self.log, "a") as log:
            log.write(f"\n===== {title}: {' '.join(map(str, cmd))}\n")
            log.flush()
            start = log.tell()
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
        with open(self.log) as log:
            log.seek(start)
            return code, log.read()[-2000:]

    def install_wheels(self) -> None:
        folder = self.args.wheels
        wheels = sorted(folder.glob("*.whl")) if folder is not None and folder.is_dir() else []
        info = self.results["wheels"]
        info.update(folder=str(folder) if folder else None, wheels=[w.name for w in wheels])
        if not wheels:
            info["status"] = "none to install"
            return
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        cmd += ["--no-compile", "--no-cache-dir", "--upgrade", "--target", str(self.args.site)]
        code, tail = self.run([*cmd, *map(str, wheels)], 180, "wheels")
        info.update(status="ok" if code == 0 else "failed", seconds=time.monotonic() - t0)
        info["megabytes"] = round(sum(w.stat().st_size for w in wheels) / 2**20, 1)
        if code == 0:
            self.pythonpath.insert(0, str(self.args.site))
            info["installed"] = installed(self.args.site)
        else:
            info["error"] = tail

    def run_part(self, spec: PartSpec) -> None:
        left = self.args.budget - self.elapsed() - (0 if spec.name == "estimates" else RESERVE_S)
        timeout = min(spec.cpu_s if self.args.cpu else spec.gpu_s, left)
        record = self.results["parts"][spec.name] = {"timeout_s": round(timeout, 1)}
        if timeout < MIN_PART_S:
            record.update(status="skipped", error=f"the budget ({self.args.budget:.0f} s) is spent")
            return
        print(f"[gpu_check] {spec.name} (up to {timeout:.0f} s) ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        if spec.name == "cuda_tests":
            code, tail = self.cuda_tests(timeout)
        else:
            code, tail = self.run(self.part_command(spec.name), timeout, spec.name)
            self.read_part(spec.name, record)
        record["seconds"] = round(time.monotonic() - t0, 1)
        if code is None:
            record.update(status="timeout", error=f"stopped after {timeout:.0f} s")
        elif code != 0 or record.get("errors"):
            record["status"] = "failed"
            record.setdefault("error", tail.strip().splitlines()[-1] if tail.strip() else "")
        else:
            record["status"] = "ok"
        print(f"[gpu_check] {spec.name}: {record['status']}", file=sys.stderr, flush=True)

    def part_command(self, name: str) -> list:
        cmd = [sys.executable, str(SCRIPTS / "gpu_parts.py"), name, "--scratch", str(self.scratch)]
        cmd += ["--results", str(self.out / "gpu_check.json")]
        return cmd + (["--cpu"] if self.args.cpu else [])

    def read_part(self, name: str, record: dict) -> None:
        """What the part wrote (also when it was stopped: it saves as it goes)."""
        path = self.scratch / (name.replace(":", "_") + ".json")
        if path.exists():
            saved = json.loads(path.read_text())
            record["result"] = saved["result"]
            if saved["errors"]:
                record["errors"] = saved["errors"]
                record["error"] = "; ".join(f"{k}: {v}" for k, v in saved["errors"].items())

    def cuda_tests(self, timeout: float) -> tuple[int | None, str]:
        """``pytest -m cuda`` over the whole suite; each test's outcome from its JUnit XML."""
        xml = self.scratch / "cuda_tests.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rs", "tests"]
        cmd += ["--continue-on-collection-errors", "-p", "no:cacheprovider", f"--junitxml={xml}"]
        if not self.args.cpu and importlib.util.find_spec("xdist") is not None:
            cmd += ["-n", "4"]  # pytest-xdist (on the GPU machine): 4 test processes, one GPU
        code, tail = self.run(cmd, timeout, "cuda_tests")
        record = self.results["parts"]["cuda_tests"]
        if xml.exists():
            record["result"] = junit_outcomes(xml)
            tests = record["result"]["tests"].items()
            bad = {n: t["message"] for n, t in tests if t["outcome"] in ("failed", "error")}
            if bad:
                record["errors"] = bad
                record["error"] = f"{len(bad)} failed: " + ", ".join(n.split("::")[-1] for n in bad)
        return code, tail

    # ------------------------------------------------------------------ reporting
    def write(self) -> None:
        self.results["check"]["seconds"] = round(self.elapsed(), 1)
        (self.out / "gpu_check.json").write_text(json.dumps(self.results, indent=1) + "\n")
        (self.out / "gpu_check.md").write_text(write_markdown(self.results))

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def installed(site: Path) -> dict:
    """Distribution -> its version and top-level modules, as pip installed them into ``site``."""
    out = {}
    for info in sorted(site.glob("*.dist-info")):
        header = (info / "METADATA").read_text(errors="replace").split("\n\n", 1)[0]
        meta = {}
        for line in header.splitlines():  # the header alone: a description may hold "Name: "
            if line.startswith(("Name: ", "Version: ")):
                meta.setdefault(*line.split(": ", 1))
        tops = {line.split("/", 1)[0] for line in (info / "RECORD").read_text().splitlines()}
        modules = sorted(
            t[:-3] if t.endswith(".py") else t
            for t in tops
            if t and (t.endswith(".py") or "." not in t) and t not in ("bin", "..")
        )
        out[meta.get("Name", info.name)] = {"version": meta.get("Version"), "modules": modules}
    return out


def junit_outcomes(xml: Path) -> dict:
    """Counts by outcome, and each test's outcome with the first line of its message."""
    tests = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (found.get("message") or found.text or "").strip().splitlines()[:1]
                message = message[0][:300] if message else ""
                break
        tests[name] = {
            "outcome": outcome,
            "seconds": float(case.get("time", 0)),
            "message": message,
        }
    counts = {}
    for t in tests.values():
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    return {"counts": counts, "tests": tests}


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def main(argv=None) -> int:
    args = parse(argv)
    check = Check(args)
    try:
        check.install_wheels()
        check.write()
        for spec in PARTS:
            if args.only and spec.name not in (*args.only, *ALWAYS):
                continue
            check.run_part(spec)
            check.write()
    finally:
        check.close()
    parts = check.results["parts"].values()
    print((Path(args.out) / "gpu_check.md").read_text(), flush=True)
    return 0 if all(p["status"] == "ok" for p in parts) else 1


if __name__ == "__main__":
    sys.exit(main())
