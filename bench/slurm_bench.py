"""Slurm on a real single-node cluster: the time `plan push` takes for 2000 jobs (a `foreach` group, pushed as
job arrays, and the same 2000 as separate jobs), and the same 200-job plan on Slurm and on the bundled runner:
push-to-done, and the latency from a producer's end to its consumer's start. Runs alternated, figures as
min / median / max: `python3 bench/slurm_bench.py [PUSH_RUNS [PLAN_RUNS]]` (5 and 3 by default: one 200-job
run on Slurm takes minutes). `python3 bench/slurm_bench.py latency [RUNS]` (7 by default): a producer's end to
its dependent's start, a plan's `after:` pushed by `plan push` against the same two bodies submitted by hand
with plain `sbatch --dependency=afterok`, paired runs alternated."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import PY_ENV, machine, plan_cli, run_step, spread, table  # noqa: E402
from tests.slurm.cluster import Slurm, start_slurm, stop_slurm  # noqa: E402

PAIRS = 100  # producer p<i> and its consumer c<i> (after p<i>): 200 jobs


def write_plan(path: Path, spans: Path, outs: Path) -> None:
    lines = ["plan: bench", "jobs:"]
    for i in range(PAIRS):
        for name, dep in ((f"p{i:03d}", None), (f"c{i:03d}", f"p{i:03d}")):
            body = (
                f'echo \\"$(date +%s.%N) start {name}\\" >> {spans}; touch {outs}/{name}; '
                f'echo \\"$(date +%s.%N) end {name}\\" >> {spans}'
            )
            lines += [f"  - name: {name}", f'    run: "{body}"', f"    outputs: ['{outs}/{name}']"]
            if dep:
                lines.append(f"    requires: [{{after: {dep}}}]")
    path.write_text("\n".join(lines) + "\n")


def successor_latency(spans: Path) -> float:
    """Median seconds from p<i>'s end to c<i>'s start."""
    marks: dict[tuple[str, str], float] = {}
    for line in spans.read_text().splitlines():
        ts, what, name = line.split()
        marks[(what, name)] = float(ts)
    return statistics.median(marks[("start", f"c{i:03d}")] - marks[("end", f"p{i:03d}")] for i in range(PAIRS))


def run_slurm(work: Path, hosts: Path, plan: Path, spans: Path) -> tuple[float, float]:
    start = time.perf_counter()
    subprocess.run(
        plan_cli("push", "cluster", str(plan), "--hosts", str(hosts)), env=PY_ENV, check=True, capture_output=True
    )
    deadline = time.monotonic() + 900
    while len(list((work / "outs").iterdir())) < 2 * PAIRS or spans.read_text().count(" end ") < 2 * PAIRS:
        if time.monotonic() > deadline:
            raise RuntimeError("the Slurm run did not finish")
        time.sleep(0.1)
    return time.perf_counter() - start, successor_latency(spans)


def run_runner(work: Path, plan: Path, spans: Path) -> tuple[float, float]:
    start = time.perf_counter()
    subprocess.run(
        plan_cli("run", str(plan), "--root", str(work / "queue")), env=PY_ENV, check=True, capture_output=True
    )
    return time.perf_counter() - start, successor_latency(spans)


PUSHED = 2000


def write_wide_plan(path: Path, foreach: bool) -> None:
    """PUSHED independent jobs: one `foreach` group, or as many jobs written out one by one."""
    if foreach:
        rows = ", ".join(str(i) for i in range(PUSHED))
        path.write_text(
            f"plan: wide\nvars:\n  rows: [{rows}]\njobs:\n  - name: 'j{{{{ i }}}}'\n"
            "    foreach: {i: rows}\n    run: 'true'\n"
        )
    else:
        path.write_text("plan: wide\njobs:\n" + "".join(f"  - name: j{i}\n    run: 'true'\n" for i in range(PUSHED)))


def time_push(cluster: Slurm, work: Path, foreach: bool) -> float:
    """Seconds of one whole `plan push` of the wide plan (its lint cache warm), with the partition down so
    that no job runs meanwhile; its jobs are cancelled after."""
    work.mkdir(parents=True)
    plan = work / "wide.yaml"
    write_wide_plan(plan, foreach)
    subprocess.run(plan_cli("check", str(plan)), env=PY_ENV, check=False, capture_output=True)
    hosts = cluster.hosts_file(work / "submit")
    scontrol = ["scontrol", "update", "PartitionName=debug"]
    subprocess.run([*scontrol, "State=DOWN"], env=cluster.env, check=True)
    try:
        took = run_step(plan_cli("push", "cluster", str(plan), "--hosts", str(hosts)))
    finally:
        subprocess.run(["scancel", "-u", "root"], env=cluster.env, check=False)
        subprocess.run([*scontrol, "State=UP"], env=cluster.env, check=True)
    jobs = json.loads((work / "submit" / "slurm.json").read_text())["plans"]["wide"]["jobs"]
    if len(jobs) != PUSHED:
        raise RuntimeError(f"the push recorded {len(jobs)} jobs, not {PUSHED}")
    return took


def bench_push(cluster: Slurm, base: Path, runs: int) -> str:
    samples: dict[str, list[float]] = {"foreach (job arrays)": [], "separate jobs": []}
    for run in range(runs):
        for kind in samples:
            samples[kind].append(time_push(cluster, base / f"push-{run}-{len(kind)}", kind.startswith("foreach")))
    return table(
        f"`plan push` of {PUSHED} jobs to Slurm (the whole command, lint cache warm), {runs} alternated runs",
        ["plan", "push"],
        [[kind, spread(values)] for kind, values in samples.items()],
    )


MARK = 'echo "$(date +%s.%N) {what}" >> {spans}'


def _ends(spans: Path) -> float:
    """Seconds from the producer body's last line to the dependent body's first, once both are written."""
    deadline = time.monotonic() + 120
    while True:
        marks = dict(line.split()[::-1] for line in spans.read_text().splitlines()) if spans.exists() else {}
        if "start-c" in marks and "end-p" in marks:
            return float(marks["start-c"]) - float(marks["end-p"])
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pair did not run: {marks}")
        time.sleep(0.05)


def latency_tool(cluster: Slurm, work: Path) -> float:
    spans = work / "spans"
    work.mkdir(parents=True)
    plan = work / "pair.yaml"
    p_body = f"{MARK.format(what='end-p', spans=spans)}; touch {work}/p.out"
    plan.write_text(
        "plan: pair\njobs:\n"
        f"  - name: p\n    run: '{p_body}'\n    outputs: ['{work}/p.out']\n"
        f"  - name: c\n    run: '{MARK.format(what='start-c', spans=spans)}'\n    requires: [{{after: p}}]\n"
    )
    subprocess.run(plan_cli("check", str(plan)), env=PY_ENV, check=False, capture_output=True)  # lint cache warm
    hosts = cluster.hosts_file(work / "submit")
    subprocess.run(
        plan_cli("push", "cluster", str(plan), "--hosts", str(hosts)), env=PY_ENV, check=True, capture_output=True
    )
    return _ends(spans)


def latency_plain(cluster: Slurm, work: Path) -> float:
    spans = work / "spans"
    work.mkdir(parents=True)
    base = ["sbatch", "--parsable", f"--chdir={work}", "--output=/dev/null", "--kill-on-invalid-dep=yes"]
    p = subprocess.run(
        [*base, "--wrap", MARK.format(what="end-p", spans=spans)],
        env=cluster.env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run(
        [*base, f"--dependency=afterok:{p}", "--wrap", MARK.format(what="start-c", spans=spans)],
        env=cluster.env,
        check=True,
        capture_output=True,
    )
    return _ends(spans)


def bench_latency(runs: int = 7) -> None:
    base = Path(tempfile.mkdtemp(prefix="plan-slurm-latency-"))
    cluster = start_slurm(base / "cluster")
    samples: dict[str, list[float]] = {"plan push, `after:`": [], "plain sbatch --dependency=afterok": []}
    try:
        for run in range(runs):  # alternated, so the machine's noise hits both alike
            samples["plan push, `after:`"].append(latency_tool(cluster, base / f"tool-{run}"))
            samples["plain sbatch --dependency=afterok"].append(latency_plain(cluster, base / f"plain-{run}"))
    finally:
        stop_slurm(cluster)
        shutil.rmtree(base, ignore_errors=True)
    print(
        table(
            f"a producer's end (its body's last line) to its dependent's start (its body's first), {runs} paired runs",
            ["submitted by", "job end -> dependent start"],
            [[kind, spread(values)] for kind, values in samples.items()],
        )
    )
    print(machine())


def main(push_runs: int = 5, runs: int = 3) -> None:
    base = Path(tempfile.mkdtemp(prefix="plan-slurm-bench-"))
    cluster = start_slurm(base / "cluster", min_job_age=10)  # cancelled bench jobs leave the controller soon
    samples: dict[str, dict[str, list[float]]] = {k: {"done": [], "succ": []} for k in ("slurm", "runner")}
    try:
        print(bench_push(cluster, base, push_runs))
        for run in range(runs):
            for kind in ("slurm", "runner"):  # alternated, so the machine's noise hits both alike
                work = base / f"{kind}-{run}"
                (work / "outs").mkdir(parents=True)
                spans, plan = work / "spans", work / "bench.yaml"
                spans.touch()
                write_plan(plan, spans, work / "outs")
                if kind == "slurm":
                    hosts = cluster.hosts_file(work / "submit")
                    done, succ = run_slurm(work, hosts, plan, spans)
                else:
                    done, succ = run_runner(work, plan, spans)
                samples[kind]["done"].append(done)
                samples[kind]["succ"].append(succ)
    finally:
        stop_slurm(cluster)
        shutil.rmtree(base, ignore_errors=True)
    rows = [[kind, spread(s["done"]), spread(s["succ"])] for kind, s in samples.items()]
    print(
        table(
            f"the same 200 jobs (100 producer -> consumer pairs) on Slurm and on the bundled runner, {runs} "
            "alternated runs",
            ["backend", "push to all done", "successor start latency (median per run)"],
            rows,
        )
    )
    print(machine())


if __name__ == "__main__":
    if sys.argv[1:2] == ["latency"]:
        bench_latency(*(int(a) for a in sys.argv[2:3]))
    else:
        main(*(int(a) for a in sys.argv[1:3]))
