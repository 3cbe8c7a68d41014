"""`plan check` as a whole process on generated plans: cold against the naive loop and the shellcheck floor; warm."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PY_ENV, alternate, machine, plan_cli, ratio, run_step, spread, table
from plancompiler.compile import compile_plan

TEMPLATES = {
    "fetch.sh.j2": "# fetch {{ model }}\nset -eu\nmkdir -p {{ dest }}\nfor f in {{ files }}; do\n"
    '  curl -fL -o {{ dest }}/"$f" {{ base }}/"$f"\ndone\ntouch {{ dest }}/.ok\n',
    "intake.sh.j2": '# intake {{ model }}\nset -u\ndir={{ work }}/intake/{{ model }}\nmkdir -p "$dir"\n'
    'server --model {{ dest }}/m.gguf --port {{ port }} >"$dir/server.log" 2>&1 &\nserver=$!\n'
    'stop() { kill "$server" 2>/dev/null; true; }\ntrap stop EXIT\nrc=0\n'
    'for client in a b c; do\n  echo "== smoke / $client"\n'
    '  if ! bash {{ work }}/smoke.sh "$client" {{ port }}; then rc=1; fi\ndone\n'
    'if [ "$rc" -eq 0 ]; then echo ok >{{ gate }}; fi\nexit "$rc"\n',
    "bench.sh.j2": "# bench {{ model }} {{ arm }}\nset -eu\nout={{ work }}/bench/{{ model }}-{{ arm }}.jsonl\n"
    'bash {{ work }}/run-arm.sh {{ arm }} {{ dest }}/m.gguf >"$out.part"\nmv "$out.part" "$out"\n',
}


def make_plan(directory: Path, jobs: int) -> Path:
    """A realistic plan: per model a download, an intake after it, and benchmark arms after the intake."""
    (directory / "templates").mkdir(parents=True, exist_ok=True)
    for name, body in TEMPLATES.items():
        (directory / "templates" / name).write_text(body)
    arms = 3
    models = max(1, jobs // (2 + arms))
    roster = "\n".join(f"    - {{model: m{i:04d}, port: {40000 + i}}}" for i in range(models))
    text = f"""plan: gen
vars:
  work: /srv/work
  base: https://example.invalid/models
  roster:
{roster}
jobs:
  - name: "10-net-fetch-{{{{ model }}}}"
    foreach: roster
    lane: net
    template: fetch.sh.j2
    with: {{dest: "{{{{ work }}}}/models/{{{{ model }}}}", files: [m.gguf, config.json]}}
    outputs: ["{{{{ work }}}}/models/{{{{ model }}}}/.ok"]
  - name: "20-gpu-intake-{{{{ model }}}}"
    foreach: roster
    lane: gpu
    template: intake.sh.j2
    with: {{dest: "{{{{ work }}}}/models/{{{{ model }}}}", gate: "{{{{ work }}}}/intake/{{{{ model }}}}.ok"}}
    requires: [{{after: "10-net-fetch-{{{{ model }}}}"}}]
    outputs: ["{{{{ work }}}}/intake/{{{{ model }}}}.ok"]
  - name: "30-gpu-bench-{{{{ row.model }}}}-{{{{ arm }}}}"
    foreach: {{row: roster, arm: [a1, a2, a3]}}
    lane: gpu
    template: bench.sh.j2
    with: {{model: "{{{{ row.model }}}}", dest: "{{{{ work }}}}/models/{{{{ row.model }}}}"}}
    requires: ["{{{{ work }}}}/intake/{{{{ row.model }}}}.ok"]
    outputs: [{{nonempty: "{{{{ work }}}}/bench/{{{{ row.model }}}}-{{{{ arm }}}}.jsonl"}}]
"""
    path = directory / "plan.yaml"
    path.write_text(text)
    return path


ONE_TEMPLATE = (
    "# fetch {{ model }}\nset -eu\nmkdir -p {{ dest }}\ncd {{ dest }} || exit 1\n"
    'for f in {{ files }}; do\n  curl -fL -o "$f.part" {{ base }}/{{ model }}/"$f"\n'
    '  mv "$f.part" "$f"\ndone\nsha256sum {{ files }} >{{ dest }}/SHA256SUMS\n'
    "echo '{{ model }} fetched' >{{ dest }}/.ok\n"
)


def make_one_template_plan(directory: Path, jobs: int) -> Path:
    """JOBS jobs of one template, one per roster row: the shape most plans have (a template x many rows)."""
    (directory / "templates").mkdir(parents=True, exist_ok=True)
    (directory / "templates" / "fetch.sh.j2").write_text(ONE_TEMPLATE)
    roster = "\n".join(f"    - {{model: m{i:04d}}}" for i in range(jobs))
    text = f"""plan: one
vars:
  work: /srv/work
  base: https://example.invalid/models
  roster:
{roster}
jobs:
  - name: "10-net-fetch-{{{{ model }}}}"
    foreach: roster
    lane: net
    template: fetch.sh.j2
    with: {{dest: "{{{{ work }}}}/models/{{{{ model }}}}", files: [m.gguf, config.json]}}
    outputs: ["{{{{ work }}}}/models/{{{{ model }}}}/.ok"]
"""
    path = directory / "plan.yaml"
    path.write_text(text)
    return path


def change_one_port(plan: Path, text: str, ports: Iterator[int]) -> None:
    """Give one roster row a new port, which only its intake job uses: one job's text changes."""
    plan.write_text(text.replace("port: 40000}", f"port: {next(ports)}}}", 1))


def naive_argv(files: list[Path]) -> list[str]:
    """The loop a user would write: `bash -n`, then shellcheck, one process per file per tool."""
    script = (
        'for f in "$@"; do bash -n "$f"; '
        'shellcheck --format=json1 --shell=bash --severity=warning "$f" >/dev/null; done; exit 0'
    )
    return ["bash", "-c", script, "naive", *map(str, files)]


def floor_argv(files: list[Path]) -> list[str]:
    """shellcheck alone over the rendered files, one process per core: what linting what is rendered costs."""
    cores = os.cpu_count() or 1
    chunks = [" ".join(shlex.quote(str(f)) for f in files[i::cores]) for i in range(cores)]
    command = "shellcheck --format=json1 --shell=bash --severity=warning"
    script = " ".join(f"{command} {c} >/dev/null &" for c in chunks if c)
    return ["bash", "-c", script + " wait"]


def _rendered(plan: Path, directory: Path) -> list[Path]:
    """PLAN's job files written out, for the naive loop and the shellcheck floor."""
    compiled = compile_plan(plan, use_cache=False)
    assert compiled.clean(), [d.text() for d in compiled.diagnostics][:5]
    out = directory / "rendered"
    out.mkdir()
    files = []
    for job in compiled.jobs:
        (out / job.filename).write_text(job.text)
        files.append(out / job.filename)
    return files


def main() -> None:
    sizes = [int(x) for x in os.environ.get("BENCH_SIZES", "100,1000").split(",")]
    runs = int(os.environ.get("BENCH_RUNS", "5"))
    print(f"machine: {machine()}; {runs} runs of each, alternated\n")
    rows, one_rows, warm_rows = [], [], []
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            plan = make_one_template_plan(directory, size)
            env = dict(PY_ENV, PLAN_CACHE_DIR=str(directory / "cache"))
            files = _rendered(plan, directory)
            cold = alternate(
                runs, {"check": plan_cli("check", str(plan), "--no-cache"), "floor": floor_argv(files)}, env
            )
            one_rows.append(
                [str(len(files)), spread(cold["check"]), spread(cold["floor"]), ratio(cold["check"], cold["floor"])]
            )
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            plan = make_plan(directory, size)
            env = dict(PY_ENV, PLAN_CACHE_DIR=str(directory / "cache"))
            files = _rendered(plan, directory)
            # The naive loop over more than 1000 files takes minutes: timed on the first 1000, scaled.
            sample = files[:1000]
            scale = len(files) / len(sample)
            cold = alternate(
                runs,
                {
                    "check": plan_cli("check", str(plan), "--no-cache"),
                    "naive": naive_argv(sample),
                    "floor": floor_argv(files),
                },
                env,
            )
            naive_s = [t * scale for t in cold["naive"]]
            rows.append(
                [
                    str(len(files)),
                    spread(cold["check"]),
                    spread(naive_s) + ("*" if scale > 1 else ""),
                    spread(cold["floor"]),
                    ratio(naive_s, cold["check"]),
                    ratio(cold["check"], cold["floor"]),
                ]
            )
            run_step(plan_cli("check", str(plan)), env)  # fill the cache
            warm = alternate(runs, {"bare": [sys.executable, "-c", "pass"], "warm": plan_cli("check", str(plan))}, env)
            # one job changed: a single roster row gets a new port, which only its intake uses
            one = alternate(
                runs,
                {"one": plan_cli("check", str(plan))},
                env,
                before_each=partial(change_one_port, plan, plan.read_text(), iter(range(49000, 50000))),
            )
            warm_rows.append(
                [
                    str(len(files)),
                    spread(warm["bare"]),
                    spread(warm["warm"]),
                    spread(one["one"]),
                    ratio(warm["warm"], warm["bare"]),
                ]
            )
    print(
        table(
            "plan check, cold (--no-cache), one template x N rows, whole processes",
            ["jobs", "plan check", "shellcheck floor", "check / floor (target <= 0.5)"],
            one_rows,
        )
    )
    print(
        table(
            "plan check, cold (--no-cache), three templates (fetch, intake, bench arms), whole processes",
            ["jobs", "plan check", "naive loop", "shellcheck floor", "naive / check", "check / floor"],
            rows,
        )
    )
    print("* naive loop timed on 1000 of the files and scaled. Ratios: of medians (range over paired runs).\n")
    print(
        table(
            "plan check, warm (cache), whole processes",
            ["jobs", "python3 -c pass", "unchanged", "one job changed", "unchanged / bare python"],
            warm_rows,
        )
    )


if __name__ == "__main__":
    main()
