"""Side by side with the peers on the same work, whole processes: the 1000-job DAG's static check against
`snakemake -n`, and 200 chained jobs dispatched by `plan run`, `snakemake --cores 2` and task-spooler.

A peer that is not installed is skipped with a printed line (snakemake: `pip install .[bench]`;
task-spooler: Debian's `task-spooler`, whose command is `tsp`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.check_bench import make_plan
from bench.common import PY_ENV, alternate, machine, plan_cli, ratio, run_step, spread, table

CHAIN = 200

# The check bench's 1000-job plan as a Snakefile: per model a download, an intake after it, three arms after that.
SNAKE_DAG = """\
MODELS = [f"m{{i:04d}}" for i in range({models})]
ARMS = ["a1", "a2", "a3"]

rule all:
    input: expand("bench/{{model}}-{{arm}}.jsonl", model=MODELS, arm=ARMS)

rule fetch:
    output: "models/{{model}}/.ok"
    shell: "mkdir -p models/{{wildcards.model}} && curl -fL -o models/{{wildcards.model}}/m.gguf "
           "https://example.invalid/m && touch {{output}}"

rule intake:
    input: "models/{{model}}/.ok"
    output: "intake/{{model}}.ok"
    shell: "bash smoke.sh {{wildcards.model}} && echo ok > {{output}}"

rule bench:
    input: "intake/{{model}}.ok"
    output: "bench/{{model}}-{{arm}}.jsonl"
    shell: "bash run-arm.sh {{wildcards.arm}} models/{{wildcards.model}}/m.gguf > {{output}}"
"""

# CHAIN jobs, each after the one before it: dispatch cost, nothing else (each job touches one file).
SNAKE_CHAIN = """\
rule all:
    input: "out/{last}"

def previous(wildcards):
    i = int(wildcards.i)
    return [f"out/{{i - 1:03d}}"] if i > 0 else []

rule step:
    input: previous
    output: "out/{{i}}"
    shell: "touch {{output}}"
"""


def plan_chain(directory: Path) -> Path:
    jobs = []
    for i in range(CHAIN):
        after = f"\n    requires: [{{after: step-{i - 1:03d}}}]" if i else ""
        jobs.append(
            f"  - name: step-{i:03d}\n    lane: cpu\n    run: touch {directory}/out/{i:03d}\n"
            f"    outputs: [{directory}/out/{i:03d}]{after}"
        )
    path = directory / "chain.yaml"
    path.write_text("plan: chain\njobs:\n" + "\n".join(jobs) + "\n")
    return path


def tsp_chain(directory: Path) -> None:
    """CHAIN jobs queued on a fresh task-spooler server with 2 slots, each after the one before (-d); waits."""
    with tempfile.TemporaryDirectory(prefix="tsp-") as server:
        env = dict(os.environ, TS_SOCKET=str(Path(server) / "ts.sock"), TMPDIR=server)
        subprocess.run(["tsp", "-S", "2"], env=env, check=True, stdout=subprocess.DEVNULL)
        try:
            for i in range(CHAIN):
                # -d: run only if the job queued before ends well (1.0.1's `-D ID` misreads the command after it)
                argv = ["tsp", "-n", *(["-d"] if i else []), "touch", str(directory / "out" / f"{i:03d}")]
                subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
            last = str(CHAIN - 1)  # a fresh server numbers its jobs from 0 (the client does not always print it)
            # `tsp -w` of 1.0.1 sometimes returns while the chain still runs: ask the last job's state too
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                subprocess.run(["tsp", "-w", last], env=env, check=False, stdout=subprocess.DEVNULL)
                state = subprocess.run(["tsp", "-s", last], env=env, capture_output=True, text=True).stdout.strip()
                if state == "finished":
                    break
                time.sleep(0.005)
        finally:
            subprocess.run(["tsp", "-K"], env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert (directory / "out" / f"{CHAIN - 1:03d}").exists(), "task-spooler did not run the chain"


def fresh(directory: Path) -> None:
    """An empty work directory for the next dispatch run: no job of a run finds the last one's outputs."""
    for name in ("out", "q", ".snakemake"):
        shutil.rmtree(directory / name, ignore_errors=True)
    (directory / "out").mkdir()


def main() -> None:
    runs = int(os.environ.get("BENCH_RUNS", "5"))
    print(f"machine: {machine()}; {runs} runs of each, alternated\n")
    snakemake = shutil.which("snakemake")
    tsp = shutil.which("tsp")
    if snakemake is None:
        print("snakemake not found: its lines are skipped (pip install '.[bench]')\n")
    if tsp is None:
        print("task-spooler (tsp) not found: its line is skipped (apt-get install task-spooler)\n")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        plan = make_plan(directory, 1000)
        models = 1000 // 5
        (directory / "Snakefile").write_text(SNAKE_DAG.format(models=models))
        env = dict(PY_ENV, PLAN_CACHE_DIR=str(directory / "cache"))
        variants = {"cold": plan_cli("check", str(plan), "--no-cache")}
        if snakemake:
            variants["snakemake"] = [
                snakemake,
                "-n",
                "--quiet",
                "--cores",
                "1",
                "-d",
                str(directory / "work"),
                "-s",
                str(directory / "Snakefile"),
            ]
        run_step(plan_cli("check", str(plan)), env)  # the memo and the shellcheck cache for the warm line
        variants["warm"] = plan_cli("check", str(plan))
        static = alternate(runs, variants, env)
        rows = [
            ["plan check, cold (--no-cache)", spread(static["cold"]), "1.00x"],
            ["plan check, warm (unchanged plan)", spread(static["warm"]), ratio(static["warm"], static["cold"])],
        ]
        if snakemake:
            rows.append(
                [
                    "snakemake -n (DAG only, lints nothing)",
                    spread(static["snakemake"]),
                    ratio(static["snakemake"], static["cold"]),
                ]
            )
    print(
        table(
            "static check of the same 1000-job DAG, whole processes",
            ["tool", "min / median / max", "vs cold plan check"],
            rows,
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        chain = plan_chain(directory)
        (directory / "Snakefile").write_text(SNAKE_CHAIN.format(last=f"{CHAIN - 1:03d}"))
        env = dict(PY_ENV, PLAN_CACHE_DIR=str(directory / "cache"))
        run_step(plan_cli("check", str(chain)), env)  # plan run's check warm, as a user's second run would be
        variants = {"plan run": plan_cli("run", str(chain), "--root", str(directory / "q"))}
        if snakemake:
            variants["snakemake"] = [
                snakemake,
                "--quiet",
                "--cores",
                "2",
                "-d",
                str(directory),
                "-s",
                str(directory / "Snakefile"),
            ]
        if tsp:
            variants["tsp"] = lambda: tsp_chain(directory)
        dispatch = alternate(runs, variants, env, before_each=lambda: fresh(directory))
    rows = [
        [
            "plan run (check, push, runner)",
            spread(dispatch["plan run"]),
            "1.00x",
            f"{1000 * min(dispatch['plan run']) / CHAIN:.1f} ms",
        ]
    ]
    if snakemake:
        rows.append(
            [
                "snakemake --cores 2",
                spread(dispatch["snakemake"]),
                ratio(dispatch["snakemake"], dispatch["plan run"]),
                f"{1000 * min(dispatch['snakemake']) / CHAIN:.1f} ms",
            ]
        )
    if tsp:
        rows.append(
            [
                "task-spooler (tsp -S 2, -d chain)",
                spread(dispatch["tsp"]),
                ratio(dispatch["tsp"], dispatch["plan run"]),
                f"{1000 * min(dispatch['tsp']) / CHAIN:.1f} ms",
            ]
        )
    print(
        table(
            f"dispatch of {CHAIN} chained jobs (each touches one file), whole processes",
            ["tool", "min / median / max", "vs plan run", "per job (min)"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
