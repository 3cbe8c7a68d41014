"""Start-up cost of the commands people run most, as whole processes against a bare interpreter start."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PY_ENV, alternate, machine, plan_cli, ratio, run_step, spread, table

ONE_JOB = """plan: one
jobs:
  - name: 10-cpu-hello
    lane: cpu
    run: echo hello
"""


def main() -> None:
    runs = int(os.environ.get("BENCH_RUNS", "7"))
    print(f"machine: {machine()}; {runs} runs of each, alternated\n")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        plan = directory / "one.yaml"
        plan.write_text(ONE_JOB)
        root = directory / "q"
        for state in ("queue", "running", "done", "failed", "logs"):
            (root / state).mkdir(parents=True)
        env = dict(PY_ENV, PLAN_CACHE_DIR=str(directory / "cache"))
        run_step(plan_cli("check", str(plan)), env)  # warm: the shellcheck result is cached
        samples = alternate(
            runs,
            {
                "bare": [sys.executable, "-c", "pass"],
                "check": plan_cli("check", str(plan)),
                "status": plan_cli("status", str(root)),
                "runner status": [sys.executable, "-m", "runner", "status", "--root", str(root)],
            },
            env,
        )
    rows = [
        [name, spread(values), ratio(values, samples["bare"])] for name, values in samples.items() if name != "bare"
    ]
    rows.insert(0, ["python3 -c pass", spread(samples["bare"]), "1.00x"])
    print(table("command start-up, whole processes", ["command", "min / median / max", "vs bare python3"], rows))


if __name__ == "__main__":
    main()
