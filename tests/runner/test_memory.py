"""What the runner keeps per queued job, kept small (issue 33: 100 000 queued jobs): manifest.json read a piece at
a time as json reads it whole, and equal things (header shapes, paths, reasons) one object for all the jobs that
have them, never changed in place under another job."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from runner import jobfile, state
from runner.conditions import compile_condition
from runner.queue import Queue
from runner.runstate import RunnerState
from runner.service import reasons as reasons_module
from runner.service.reasons import Reasons
from runner.state import JobEntry, JsonPieces
from tests.conftest import write_job
from tests.ticking import Ticking

T0 = 1_800_000_000.0


def _hook(value: dict[str, Any]) -> Any:
    return ("object", sorted(value.items(), key=repr))


def _document(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.random()
    if depth > 4 or pick < 0.3:
        return rng.choice([1, -2.5, 1e300, 10**20, 0, 's\n"é\u2028', "", True, False, None])
    if pick < 0.6:
        return [_document(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {f"k{rng.randrange(9)}": _document(rng, depth + 1) for _ in range(rng.randrange(5))}


@pytest.mark.parametrize("piece", [1, 2, 7, 64])
def test_json_read_a_piece_at_a_time_is_what_json_reads_whole(monkeypatch: pytest.MonkeyPatch, piece: int) -> None:
    monkeypatch.setattr(state, "_PIECE", piece)
    rng = random.Random(piece)
    for _ in range(300):
        text = json.dumps(_document(rng), indent=rng.choice([None, 1]))
        got = JsonPieces(io.BytesIO(text.encode()), _hook).read()
        assert repr(got) == repr(json.loads(text, object_hook=_hook)), text
    for text in ['{"a":1,"a":2}', "[1,2,12345678901234567890]", "\ufeff[1]", "[NaN, -Infinity]", "  7  "]:
        assert repr(JsonPieces(io.BytesIO(text.encode()), None).read()) == repr(json.loads(text.encode()))
    for bad in ["{", '{"a" 1}', "[1,]", '{"a":1,}', "[1 2]", "{} x", "", "nul", "[1.]", "[01]", "[1]2", "{1:2}"]:
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            JsonPieces(io.BytesIO(bad.encode()), None).read()
    with pytest.raises(ValueError, match="nested too deep"):
        JsonPieces(io.BytesIO(b"[" * 100_000), None).read()


def test_the_runner_reads_a_manifest_in_pieces_without_the_plans_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = {
        f"j{i:03d}.job": {"sha": f"{i:064x}", "after": [], "requires": [f"/in/{i}"], "family": "f"} for i in range(50)
    }
    producers = {f"/out/{i}": [f"j{i:03d}.job"] for i in range(50)}
    plans = {"p": {"by": "me", "hash": "h", "pushed_at": "now", "jobs": jobs, "producers": producers}}
    raw = {"generation": 3, "jobs": jobs, "producers": producers, "plans": plans, "external": ["/e"]}
    (tmp_path / "manifest.json").write_text(json.dumps(raw, indent=1))
    whole, problems = Queue(tmp_path).read_manifest(compact=True)
    monkeypatch.setattr(state, "_PIECE", 16)  # every container larger than a piece: read member by member
    pieces, more = Queue(tmp_path).read_manifest(compact=True)
    assert pieces is not None and whole is not None and problems == more == []
    for read in (whole, pieces):
        assert read["plans"] == {"p": {"by": "me", "hash": "h", "pushed_at": "now"}}
        assert {name: dict(entry) for name, entry in read["jobs"].items()} == {
            name: {**entry, "after": (), "requires": tuple(entry["requires"])} for name, entry in jobs.items()
        }
        assert read["producers"] == producers and read["external"] == ["/e"] and read["generation"] == 3
    assert Queue(tmp_path).read_manifest()[0] == raw  # as a reader other than the runner reads it


def test_a_sha_is_kept_as_bytes_and_read_back_as_it_was() -> None:
    sha = "0123456789abcdef" * 4
    for given in (sha, sha.upper(), "ab", sha[:-1] + "g"):
        entry = JobEntry({"sha": given, "after": []})
        assert entry["sha"] == given and dict(entry) == {"sha": given, "after": ()}
    assert isinstance(JobEntry({"sha": sha}).sha, bytes)


def test_queued_jobs_share_their_shape_paths_and_conditions(tmp_path: Path) -> None:
    root = tmp_path / "q"
    for name in ("a", "b"):
        write_job(root, f"{name}.job", f"# PLAN=p@{name}\n# OUTPUTS=/out/{name}\n# DONE_IF=test -f /out/{name}\necho\n")
    write_job(root, "c.job", "# REQUIRES=test -f /out/b\n# LANE=gpu\necho c\n")
    runner = Ticking(root).start(T0)
    runner.tick(T0)
    taken = runner.runner.scanner.taken
    a, b, c = (taken[f"{name}.job"] for name in "abc")
    assert a.job._shape is b.job._shape and a.job._shape is not c.job._shape  # type: ignore[union-attr]
    assert a.job.filename == "a.job" and a.job.name == "a" and a.job.body == ""  # type: ignore[union-attr]
    assert b.done_if is not None and c.requires is not None
    assert b.job.outputs[0] is b.done_if.checks[1] is c.requires.checks[1]  # type: ignore[union-attr,index]
    assert b.done_if.tests == (("f", "/out/b"),) and b.done_if.text == b.job.done_if == "test -f /out/b"  # type: ignore[union-attr]
    assert b.done_if._text is None  # the compiler's words: the text is its checks, said again when asked
    parsed = jobfile.parse("b.job", (root / "queue/b.job").read_bytes())
    assert isinstance(parsed, jobfile.JobFile) and parsed.body == "echo\n"
    assert parsed.header(None, b.done_if, parsed.outputs) == b.job
    kept = compile_condition("test  -f /out/b", "/r")  # other words for the same test: kept as written
    assert kept.text == "test  -f /out/b" and kept.checks == compile_condition("test -f /out/b", "/r").checks
    assert compile_condition("test -f out/b && [ -s /c ]", "/r").text == "test -f out/b && [ -s /c ]"
    with pytest.raises(AttributeError):
        parsed.filename = "x.job"  # type: ignore[misc]


def test_equal_reasons_are_one_object_and_a_change_to_one_job_leaves_the_others() -> None:
    reasons = Reasons(RunnerState())
    for name in ("a.job", "b.job", "c.job"):
        reasons.set(T0, name, "lane-full", "x.job is running in cpu", "x.job")
    assert reasons["a.job"] is reasons["b.job"] is reasons["c.job"]
    reasons.set(T0 + 1, "a.job", "lane-full", "y.job is running in cpu", "x.job")
    reasons.requires_false(T0 + 2, "b.job", "test -f /x", None)
    assert (reasons["a.job"].detail, reasons["a.job"].since) == ("y.job is running in cpu", T0)
    assert (reasons["b.job"].reason, reasons["b.job"].since) == ("requires", T0 + 2)
    assert (reasons["c.job"].reason, reasons["c.job"].detail) == ("lane-full", "x.job is running in cpu")
    assert reasons.by_reason == {"lane-full": 2, "requires": 1}


def test_the_runner_keeps_the_producers_a_requires_names_and_the_tables_it_read(tmp_path: Path) -> None:
    root = tmp_path / "q"
    write_job(root, "a.job", "# PLAN=p@1\n# OUTPUTS=/out/a\necho a\n")
    write_job(root, "b.job", "# PLAN=p@2\n# REQUIRES=test -f /out/a\necho b\n")
    write_job(root, "c.job", "# PLAN=p@3\n# LANE=gpu\n# REQUIRES=test -f /out/x\necho c\n")
    entry = {"sha": "0" * 64, "requires": [], "after": [], "family": "f"}
    jobs = {
        "a.job": {**entry, "outputs": ["/out/a"]},
        "b.job": {**entry, "requires": ["/out/a"], "after": ["a.job"]},
        "c.job": {**entry, "requires": ["/out/x"]},
        "x.job": {**entry, "outputs": ["/out/x"]},  # not on this host
        "y.job": {**entry, "outputs": ["/out/y"]},  # no job requires what it makes
    }
    producers = {"/out/a": ["a.job"], "/out/x": ["x.job"], "/out/y": ["y.job"]}
    (root / "manifest.json").write_text(json.dumps({"plan": "p", "jobs": jobs, "producers": producers}))
    runner = Ticking(root).start(T0)
    runner.tick(T0)
    manifest = runner.runner.manifest.get()
    assert manifest is not None and manifest["producers"] == {"/out/a": ("a.job",), "/out/x": ("x.job",)}
    assert sorted(manifest["jobs"]) == sorted(jobs)
    assert runner.procs.running() == ["a.job"]
    assert runner.reason("b.job")["reason"] != "blocked"  # type: ignore[index]  # its producer is queued here
    blocked = runner.reason("c.job")
    assert (
        blocked
        and blocked["reason"] == "blocked"
        and blocked["detail"] == ("/out/x is produced by x.job, which is not on this host")
    )
    taken = runner.runner.scanner.taken
    assert taken["a.job"].job.plan == "p@" and taken["a.job"].job.plan is taken["b.job"].job.plan  # type: ignore[union-attr]
    # the runner's read: every entry checked as it was parsed, so the checked manifest is the table read, no copy
    raw = {"jobs": {"a.job": JobEntry(jobs["a.job"])}, "producers": {"/out/a": ["a.job"]}}
    checked, problems = state.check_manifest(raw)
    assert problems == [] and checked is not None
    assert checked["jobs"] is raw["jobs"] and checked["producers"] is raw["producers"]


def test_a_reason_s_change_keeps_what_the_list_said_only_of_jobs_it_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    reasons = Reasons(RunnerState())
    for name in ("a.job", "b.job"):
        reasons.set(T0, name, "lane-busy", "x.job is running in cpu", "x.job")
    assert reasons.changed == {"a.job", "b.job"} and reasons.was == {}  # new: nothing listed them
    reasons.written()  # status.json: what changed since it is in heartbeat.json
    reasons.set(T0 + 1, "a.job", "order", "y.job is ahead of it", "y.job")
    reasons.set(T0 + 1, "c.job", "order", "y.job is ahead of it", "y.job")
    assert reasons.changed == {"a.job", "c.job"} and reasons.was == {"a.job": ("lane-busy", "x.job")}
    assert reasons.unlisted == {"a.job", "b.job", "c.job"}  # waiting.json: none of them listed yet
    reasons.listed()
    reasons.drop("b.job")
    assert reasons.unlisted == {"b.job"} and reasons.changed == {"a.job", "b.job", "c.job"}
    monkeypatch.setattr(reasons_module, "UNLISTED_MAX", 2)  # more than that: the list is written whole, names not kept
    reasons.drop("a.job")
    assert reasons.unlisted == {"a.job", "b.job"}
    reasons.drop("c.job")
    assert reasons.unlisted is None
    reasons.listed()
    assert reasons.unlisted == set()
