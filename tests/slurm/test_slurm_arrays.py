"""`foreach` groups as Slurm job arrays, and `plan status` lanes with every running job, on a real cluster."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from plancompiler.lint import _SHELLCHECK_ARGS
from plancompiler.tools import find_tool
from runner.records import replaced
from runner.slurm.attempt import pending_updates, repoint
from runner.slurm.bundle import PushJob
from runner.slurm.submit import ARRAY_MIN, CHUNK, Submitted, plan_units
from runner.slurm.wrapper import wrapper_text
from tests.conftest import plan_cli, wait_for
from tests.slurm.cluster import Slurm
from tests.slurm.jobs import attempts, cancel_root, ended, held_until, write_plan

pytestmark = pytest.mark.usefixtures("plan_env")
plan = plan_cli


def result(root: Path, plan_name: str, job: str, index: int = -1) -> dict:
    found = attempts(root, plan_name, job)[index]
    return json.loads((root / "results" / plan_name / job / f"{found['id']}.json").read_text())


def status(hosts: Path) -> dict:
    code, out = plan("status", "cluster", "--hosts", str(hosts), "--json")
    assert code == 0, out
    return json.loads(out)


def test_a_foreach_group_is_an_array_whose_elements_keep_their_own_data_dependents_and_retries(
    tmp_path: Path, slurm: Slurm
) -> None:
    out, root, gate = tmp_path / "out", tmp_path / "submit", tmp_path / "gate"
    out.mkdir()
    # a0 is slow (it ends when the test opens GATE, after b3 has run); a1 always fails (its b1 is blocked, no
    # other); a2 fails once, then its retry runs
    body = (
        f'echo "a {{{{ i }}}} $SLURM_ARRAY_TASK_ID" > {out}/a{{{{ i }}}}\n'
        f'      if [ "{{{{ i }}}}" = 0 ]; then {held_until(gate)}; fi\n'
        f'      if [ "{{{{ i }}}}" = 1 ]; then exit 3; fi\n'
        f'      if [ "{{{{ i }}}}" = 2 ] && [ ! -e {out}/once ]; then touch {out}/once; exit 4; fi\n'
    )
    p = write_plan(
        tmp_path / "ar.yaml",
        "ar",
        "  - name: 'a{{ i }}'\n    foreach: {i: [0, 1, 2, 3]}\n    retries: 2\n"
        f"    outputs: ['{out}/a{{{{ i }}}}']\n    run: |\n      {body}"
        "  - name: 'b{{ i }}'\n    foreach: {i: [0, 1, 2, 3]}\n    requires: [{after: 'a{{ i }}'}]\n"
        f"    outputs: ['{out}/b{{{{ i }}}}']\n    run: 'cat {out}/a{{{{ i }}}} > {out}/b{{{{ i }}}}'\n",
    )
    hosts = slurm.hosts_file(root, extra="    backoff_base: 1\n")
    code, text = plan("push", "cluster", str(p), "--hosts", str(hosts))
    assert code == 0, text
    try:
        first = {f"{g}{i}": attempts(root, "ar", f"{g}{i}")[0] for g in "ab" for i in range(4)}
        arrays = {g: {str(first[f"{g}{i}"]["id"]).split("_")[0] for i in range(4)} for g in "ab"}
        assert all(len(ids) == 1 for ids in arrays.values()), first  # one array per group
        base = next(iter(arrays["a"]))
        assert [first[f"a{i}"]["id"] for i in range(4)] == [f"{base}_{i}" for i in range(4)]
        names = {j["name"] for j in slurm.squeue()}
        assert {"ar/a*", "ar/b*"} <= names, names  # squeue shows the arrays as their plan groups
        listed = subprocess.run(
            ["squeue", "-h", "-o", "%j|%i"], capture_output=True, text=True, env=slurm.env, check=True
        ).stdout
        rows = [line.split("|") for line in listed.splitlines() if line.startswith("ar/b*|")]
        assert rows and all(i.startswith(f"{next(iter(arrays['b']))}_") for _, i in rows), listed  # `squeue -o %j`
        comments = {j["name"]: j["comment"] for j in slurm.squeue()}  # and which element is which job
        assert comments["ar/a*"].startswith("plan=ar@array.") and comments["ar/a*"].endswith(":a0,a1,a2,a3")
        # plan status names each running element's Slurm job
        wait_for(lambda: f"ar/a0.job  slurm {base}_0  " in plan("status", "cluster", "--hosts", str(hosts))[1], 30, 0.3)
        shown = subprocess.run(
            ["scontrol", "show", "job", f"{base}_1"], capture_output=True, text=True, env=slurm.env, check=True
        ).stdout
        assert f"StdOut={root}/logs/ar/a0..a3.{base}_1.log" in shown, shown  # each element's own
        wait_for(lambda: ended(root, "ar", "b3"), 60, 0.2)
        gate.touch()
        # each probe folds the attempts' results into the ledger (a retry's next job among them)
        done = {"queue": 0, "running": 0, "done": 6, "failed": 2}
        wait_for(lambda: status(hosts)["counts"] == done, 120, 0.5)
        assert _cancelled(slurm, attempts(root, "ar", "b1"))
        # a wrapper writes its result and then exits: until then Slurm (and so the re-push below) says running
        busy = ("RUNNING", "COMPLETING")
        wait_for(lambda: not [j for j in slurm.squeue() if j["state"] in busy and j["name"].startswith("ar/")], 30)
    finally:
        cancel_root(slurm, root)
    # each element ran with its own row's data, and its dependent read its own producer's output
    for i in (0, 2, 3):
        assert (out / f"b{i}").read_text().split()[:2] == ["a", str(i)]
    assert not (out / "b1").exists()
    # b0 waited for a0 (the slow one) only: b2 and b3 did not
    a0_end = result(root, "ar", "a0")["end"]
    assert result(root, "ar", "b0")["start"] >= a0_end
    assert min(result(root, "ar", f"b{i}")["start"] for i in (2, 3)) < a0_end
    # a2's second attempt is a job of its own; b2 waited for it and read what it wrote
    tries = attempts(root, "ar", "a2")
    assert [t["attempt"] for t in tries] == [1, 2] and isinstance(tries[1]["id"], int)
    assert result(root, "ar", "b2")["start"] >= result(root, "ar", "a2")["end"]
    assert len(attempts(root, "ar", "a1")) == 2 and ended(root, "ar", "a1") == "FAILED"
    answer = status(hosts)
    blocked = [q for q in answer["status"]["queued"] if q["reason"] == "blocked"]
    assert [q["job"] for q in blocked] == ["ar/b1.job"] and "a1" in blocked[0]["blocker"]
    events = {(e["job"], e["event"]) for e in answer["events"]}
    assert {("ar/a2.job", "retry"), ("ar/a2.job", "done"), ("ar/a1.job", "failed"), ("ar/b1.job", "blocked")} <= events
    code, text = plan("logs", "cluster", "ar/a2", "--hosts", str(hosts))
    assert code == 0 and "ar/a2 attempt 1 of 2" in text and "ar/a2 attempt 2 of 2" in text, text
    # a re-push knows every element from the ledger: nothing is submitted again
    code, text = plan("push", "cluster", str(p), "--hosts", str(hosts), "--dry-run")
    assert code == 0 and "\n  +  " not in text and "\n  r  " not in text and "6 done" in text, text


def _cancelled(slurm: Slurm, tries: list[dict]) -> bool:
    return any(j["id"] == str(tries[-1]["id"]) and j["state"] == "CANCELLED" for j in slurm.squeue())


def test_status_shows_every_running_job_of_a_lane_with_its_start(tmp_path: Path, slurm: Slurm) -> None:
    root = tmp_path / "submit"
    p = write_plan(
        tmp_path / "ln.yaml",
        "ln",
        "  - name: c1\n    run: sleep 20\n  - name: c2\n    run: sleep 20\n  - name: n1\n    lane: net\n    run: 'true'\n",
    )
    hosts = slurm.hosts_file(root)
    assert plan("push", "cluster", str(p), "--hosts", str(hosts))[0] == 0
    try:
        both = {"ln/c1.job", "ln/c2.job"}
        wait_for(lambda: {r["job"] for r in status(hosts)["status"]["running"]} == both, 60, 0.5)
        answer = status(hosts)["status"]
        cpu = answer["lanes"]["cpu"]
        assert sorted(cpu["running"]) == ["ln/c1.job", "ln/c2.job"] and cpu["busy"] == 2
        starts = sorted(r["started"] for r in answer["running"])
        assert cpu["started"] == starts and time.time() - starts[0] < 60
        assert answer["lanes"]["net"]["slots"] == 1  # the test cluster's Licenses=net:1
        code, text = plan("status", "cluster", "--hosts", str(hosts))
        assert code == 0 and "ln/c1.job" in text and "ln/c2.job" in text, text
    finally:
        cancel_root(slurm, root)


def test_array_dependencies_are_re_pointed_element_by_element() -> None:
    # element 2 of an array waiting aftercorr on array 14 now waits on 33, the retry of 14_2; element 1 does not
    assert repoint("aftercorr:14_*(unfulfilled),afterok:9(unfulfilled)", "14_2", 33, "2") == "afterok:33:9"
    assert repoint("aftercorr:14_*(unfulfilled)", "14_2", 33, "1") is None
    assert repoint("afterok:15_0(unfulfilled),afterok:15_1(unfulfilled)", "15_1", 40) == "afterok:15_0:40"
    assert repoint("afterok:7(fulfilled),afterok:8(unfulfilled)", 8, 41) == "afterok:41"
    listing = "20|20_0|afterok:8(unfulfilled)\n20|20_1|afterok:8(unfulfilled)\n31|20_2|afterok:8(unfulfilled)\n"
    # the tasks still in their array's record are updated once, by the array; a split task by its own id
    assert pending_updates(listing, 8, 41) == [("20", "afterok:41"), ("31", "afterok:41")]
    listing = "20|20_0|aftercorr:14_*(unfulfilled)\n20|20_2|aftercorr:14_*(unfulfilled)\n"
    assert pending_updates(listing, "14_2", 33) == [("20_2", "afterok:33")]


def _jobs(prefix: str, count: int, deps: list[list[str]] | None = None) -> list[PushJob]:
    group = ord(prefix)  # each call's jobs are one foreach group
    return [
        PushJob(name=f"{prefix}{i}", hash="0", text="", group=group, deps=tuple(deps[i]) if deps else ())
        for i in range(count)
    ]


def test_only_dependencies_an_array_can_say_make_an_array() -> None:
    done = Submitted({"prep": 5})
    # every element after the same job: one array, one afterok
    units = plan_units("/r", _jobs("a", 5, [["prep"]] * 5), done, {})
    assert [(len(u.jobs), u.dependency) for u in units] == [(5, "afterok:5")]
    done.ids.update({f"a{i}": f"6_{i}" for i in range(5)})
    done.sizes["6"] = 5
    # element i after element i of that array (listed in any order): aftercorr, in the producer's order
    units = plan_units("/r", _jobs("b", 5, [[f"a{4 - i}", "prep"] for i in range(5)]), done, {})
    assert [(u.dependency, [j.name for j in u.jobs]) for u in units] == [
        ("aftercorr:6,afterok:5", ["b4", "b3", "b2", "b1", "b0"])
    ]
    # element i after elements i and i+1: no array form says that, so one job each
    units = plan_units("/r", _jobs("c", 4, [[f"a{i}", f"a{i + 1}"] for i in range(4)]), done, {})
    assert [u.dependency for u in units] == [f"afterok:6_{i}:6_{i + 1}" for i in range(4)]
    # a group below ARRAY_MIN, or jobs outside a foreach, stay jobs of their own
    assert [len(u.jobs) for u in plan_units("/r", _jobs("d", ARRAY_MIN - 1), done, {})] == [1] * (ARRAY_MIN - 1)
    assert all(not u.array for u in plan_units("/r", [replaced(j, group=None) for j in _jobs("e", 5)], done, {}))
    big = plan_units("/r", _jobs("f", CHUNK + 1), done, {})  # cut evenly, never a last array of one
    assert [len(u.jobs) for u in big] == [CHUNK // 2 + 1, CHUNK // 2]


def test_an_arrays_wrapper_is_shellcheck_clean_and_picks_its_element(tmp_path: Path) -> None:
    root = tmp_path / "a root with 'quotes'"
    text = wrapper_text(str(root), "pl", "array a0..a3", {"A": "it's"}, (root / "b.json", [0, 5, 7], 2))
    script = tmp_path / "array.sbatch"
    script.write_text(text)
    lint = subprocess.run(
        [find_tool("shellcheck") or "shellcheck", *_SHELLCHECK_ARGS[1:], str(script)], capture_output=True, text=True
    )  # as every rendered job is linted
    assert lint.returncode == 0, lint.stdout
    # element 1 of the array runs bundle entry 5, as attempt 2
    line = text.splitlines()[-1].replace("exec ", "printf '%s\\n' ", 1)
    shown = subprocess.run(
        ["bash", "-c", "entries=(0 5 7); " + line], env={"SLURM_ARRAY_TASK_ID": "1"}, capture_output=True, text=True
    )
    assert shown.stdout.splitlines()[-3:] == [str(root / "b.json"), "2", "5"], shown
