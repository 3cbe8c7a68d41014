"""Every file the runner reads back (state.json, manifest.json, parked.json, control requests), checked field by field.

A field of the wrong type falls back to its default and is reported as a problem `(field, why)`, which the
runner turns into one `state-corrupt` event: well-formed JSON of the wrong shape must never crash a tick
(under systemd that is a restart loop that runs nothing).
"""

from __future__ import annotations

from typing import Any, Tuple

Problem = Tuple[str, str]  # (field, what was wrong and what was used instead)

STATE_MAPS = ("attempts", "waiting_since", "backoff_until", "last_failure", "held", "priority")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_state(raw: Any) -> tuple[dict[str, Any], list[Problem]]:
    """state.json as the runner uses it; the seed's flat {job: attempts} form is read as attempts."""
    state: dict[str, Any] = {key: {} for key in STATE_MAPS}
    problems: list[Problem] = []
    if raw is None:
        return state, problems
    if not isinstance(raw, dict):
        return state, [("(whole file)", f"expected an object, got {_kind(raw)}: started from empty state")]
    if "version" in raw and not (isinstance(raw["version"], int) and not isinstance(raw["version"], bool)):
        problems.append(("version", f"expected a whole number, got {_kind(raw['version'])}: read as version 1"))
    if not any(key in raw for key in STATE_MAPS) and "version" not in raw:  # the seed's form
        raw = {"attempts": raw}
    for key in STATE_MAPS:
        value = raw.get(key, {})
        if not isinstance(value, dict):
            problems.append((key, f"expected an object, got {_kind(value)}: used {{}}"))
            continue
        for job, item in value.items():
            if _STATE_ITEM_OK[key](item):
                state[key][job] = item
            else:
                want = {
                    "attempts": "a whole number >= 0",
                    "last_failure": "an object",
                    "held": "an object",
                    "priority": "a whole number",
                }.get(key, "a number")
                problems.append((f"{key}.{job}", f"expected {want}, got {_kind(item)} {item!r:.40}: dropped"))
    return state, problems


_STATE_ITEM_OK = {
    "attempts": lambda item: isinstance(item, int) and not isinstance(item, bool) and item >= 0,
    "waiting_since": _number,
    "backoff_until": _number,
    "last_failure": lambda item: isinstance(item, dict),
    "held": lambda item: isinstance(item, dict),
    "priority": lambda item: isinstance(item, int) and not isinstance(item, bool),
}


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def check_manifest(raw: Any) -> tuple[dict[str, Any] | None, list[Problem]]:
    """manifest.json's job graph: `jobs` {file: {requires, outputs, sha}}, `producers` {path: [file]},
    `external` [path]. Whatever has the wrong type is left out."""
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return None, [("(whole file)", f"expected an object, got {_kind(raw)}: ignored")]
    problems: list[Problem] = []
    manifest: dict[str, Any] = {k: v for k, v in raw.items() if k not in ("jobs", "producers", "external")}
    jobs: dict[str, Any] = {}
    value = raw.get("jobs", {})
    if not isinstance(value, dict):
        problems.append(("jobs", f"expected an object, got {_kind(value)}: used {{}}"))
        value = {}
    for name, entry in value.items():
        if not isinstance(entry, dict):
            problems.append((f"jobs.{name}", f"expected an object, got {_kind(entry)}: dropped"))
            continue
        clean = dict(entry)
        for key in ("requires", "outputs", "after"):
            if key in clean and not _strings(clean[key]):
                problems.append((f"jobs.{name}.{key}", f"expected a list of strings, got {_kind(clean[key])}: used []"))
                clean[key] = []
        if "sha" in clean and not isinstance(clean["sha"], str):
            problems.append((f"jobs.{name}.sha", f"expected a string, got {_kind(clean['sha'])}: ignored"))
            clean.pop("sha")
        jobs[name] = clean
    producers: dict[str, list[str]] = {}
    value = raw.get("producers", {})
    if not isinstance(value, dict):
        problems.append(("producers", f"expected an object, got {_kind(value)}: used {{}}"))
        value = {}
    for path, names in value.items():
        if _strings(names):
            producers[path] = names
        else:
            problems.append((f"producers.{path}", f"expected a list of strings, got {_kind(names)}: dropped"))
    external = raw.get("external", [])
    if not _strings(external):
        problems.append(("external", f"expected a list of strings, got {_kind(external)}: used []"))
        external = []
    manifest.update(jobs=jobs, producers=producers, external=external)
    return manifest, problems


def check_park(raw: Any) -> tuple[str, list[Problem]]:
    """Why the queue is parked, from parked.json (the file existing is what parks it)."""
    if not isinstance(raw, dict):
        return "parked", [("(whole file)", f"expected an object, got {_kind(raw)}: parked without a reason")]
    problems = [
        (key, f"expected a string, got {_kind(raw[key])}")
        for key in ("since", "reason", "by")
        if key in raw and not isinstance(raw[key], str)
    ]
    since = raw.get("since") if isinstance(raw.get("since"), str) else "?"
    reason = raw.get("reason") if isinstance(raw.get("reason"), str) else ""
    return f"parked since {since}: {reason}".strip(), problems


def check_request(raw: Any) -> tuple[dict[str, str] | None, list[Problem]]:
    """A control request's body: an object whose `by` is a string (an empty file is an empty request)."""
    if raw is None:
        return {"by": "?"}, []
    if not isinstance(raw, dict):
        return None, [("(whole file)", f"expected an object, got {_kind(raw)}: request not carried out")]
    by = raw.get("by", "?")
    if not isinstance(by, str):
        return None, [("by", f"expected a string, got {_kind(by)}: request not carried out")]
    return {"by": by}, []
