"""`plan check` on generated plans (100, 1000, 5000 jobs): cold vs the naive loop and the shellcheck floor; warm."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import alternate, machine, ms, table  # noqa: E402
from plancompiler.compile import compile_plan  # noqa: E402

TEMPLATES = {
    "fetch.sh.j2": "# fetch {{ model }}\nset -eu\nmkdir -p {{ dest }}\nfor f in {{ files }}; do\n"
                   "  curl -fL -o {{ dest }}/\"$f\" {{ base }}/\"$f\"\ndone\ntouch {{ dest }}/.ok\n",
    "intake.sh.j2": "# intake {{ model }}\nset -u\ndir={{ work }}/intake/{{ model }}\nmkdir -p \"$dir\"\n"
                    "server --model {{ dest }}/m.gguf --port {{ port }} >\"$dir/server.log\" 2>&1 &\nserver=$!\n"
                    "stop() { kill \"$server\" 2>/dev/null; true; }\ntrap stop EXIT\nrc=0\n"
                    "for client in a b c; do\n  echo \"== smoke / $client\"\n"
                    "  if ! bash {{ work }}/smoke.sh \"$client\" {{ port }}; then rc=1; fi\ndone\n"
                    "if [ \"$rc\" -eq 0 ]; then echo ok >{{ gate }}; fi\nexit \"$rc\"\n",
    "bench.sh.j2": "# bench {{ model }} {{ arm }}\nset -eu\nout={{ work }}/bench/{{ model }}-{{ arm }}.jsonl\n"
                   "bash {{ work }}/run-arm.sh {{ arm }} {{ dest }}/m.gguf >\"$out.part\"\nmv \"$out.part\" \"$out\"\n",
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


def naive(files: list[Path]) -> None:
    for f in files:
        subprocess.run(["bash", "-n", str(f)], capture_output=True)
        subprocess.run(["shellcheck", "--format=json1", "--shell=bash", "--severity=warning", str(f)],
                       capture_output=True)


def floor(files: list[Path]) -> None:
    cores = os.cpu_count() or 1
    chunks = [files[i::cores] for i in range(cores)]
    procs = [subprocess.Popen(["shellcheck", "--format=json1", "--shell=bash", "--severity=warning",
                               *map(str, chunk)], stdout=subprocess.DEVNULL) for chunk in chunks if chunk]
    for proc in procs:
        proc.wait()


def main() -> None:
    sizes = [int(x) for x in os.environ.get("BENCH_SIZES", "100,1000,5000").split(",")]
    rows, warm_rows = [], []
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            plan = make_plan(directory, size)
            os.environ["PLAN_CACHE_DIR"] = str(directory / "cache")
            compiled = compile_plan(plan, use_cache=False)
            assert compiled.clean(), [d.text() for d in compiled.diagnostics][:5]
            out = directory / "rendered"
            out.mkdir()
            files = []
            for job in compiled.jobs:
                (out / job.filename).write_text(job.text)
                files.append(out / job.filename)
            runs = 3 if size <= 1000 else 1
            # The naive loop at 5000 jobs takes minutes: timed on the first 1000 files, scaled.
            sample = files if size <= 1000 else files[:1000]
            scale = len(files) / len(sample)
            result = alternate(runs,
                               check=lambda p=plan: compile_plan(p, use_cache=False),
                               naive=lambda s=sample: naive(s),
                               floor=lambda f=files: floor(f))
            naive_s = result["naive"] * scale
            rows.append([str(len(compiled.jobs)), ms(result["check"]), ms(naive_s) + ("*" if scale > 1 else ""),
                         ms(result["floor"]), f"{naive_s / result['check']:.1f}x",
                         f"{result['check'] / result['floor']:.2f}x"])
            compile_plan(plan)  # fill the cache
            warm = alternate(runs, warm=lambda p=plan: compile_plan(p))
            # one job changed: a single roster row gets a new port, which only its intake uses
            plan.write_text(plan.read_text().replace("port: 40000}", "port: 49999}", 1))
            one = alternate(1, one_changed=lambda p=plan: compile_plan(p))
            warm_rows.append([str(len(compiled.jobs)), ms(warm["warm"]), ms(one["one_changed"])])
    print(f"machine: {machine()}\n")
    print(table("plan check, cold (no cache)", ["jobs", "plan check", "naive loop", "shellcheck floor",
                                                "vs naive", "vs floor"], rows))
    print("* naive loop timed on 1000 of the files and scaled (it takes minutes at this size)\n")
    print(table("plan check, warm (cache)", ["jobs", "unchanged", "one job changed"], warm_rows))


if __name__ == "__main__":
    main()
