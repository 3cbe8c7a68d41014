"""The systemd unit that runs this runner (for `runner unit` and `plan bootstrap`)."""

from __future__ import annotations

from runner.durations import parse_duration


def _specifiers(text: str) -> str:
    """TEXT with systemd's specifiers (%h, %n, ...) made literal; a newline cannot be written in a unit."""
    if "\n" in text or "\r" in text:
        raise ValueError(f"a unit file cannot hold a newline: {text!r}")
    return text.replace("%", "%%")


def _word(arg: str, command: bool = True) -> str:
    """ARG as one quoted word of ExecStart= (where $ expands, so it is doubled) or of Environment=, with
    backslashes, quotes and % made literal (systemd.syntax(7), systemd.service(5))."""
    escaped = _specifiers(arg).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + (escaped.replace("$", "$$") if command else escaped) + '"'


UNIT_PREFIX = "plan-runner"
_KEPT = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.")


def unit_name(root: str) -> str:
    """The unit serving ROOT: plan-runner-<ROOT as `systemd-escape --path` writes it>.service, so that each root
    has its own (two roots' bootstraps never write one unit over the other)."""
    path = "/".join(part for part in root.split("/") if part not in ("", "."))
    escaped = "".join(
        "-"
        if char == "/"
        else char
        if char in _KEPT and not (char == "." and at == 0)
        else "".join(f"\\x{byte:02x}" for byte in char.encode())
        for at, char in enumerate(path)
    )
    return f"{UNIT_PREFIX}-{escaped or '-'}.service"


def served_root(text: str) -> str | None:
    """The root a unit written by unit_text() serves (from its Description=), None for a unit it did not write."""
    for line in text.splitlines():
        if line.startswith("Description=plancompiler queue runner (") and line.endswith(")"):
            return line[len("Description=plancompiler queue runner (") : -1].replace("%%", "%")
    return None


def run_flags(tick: str = "10", cgroup: bool = True) -> list[str]:
    """The flags the unit runs the runner with; `plan bootstrap --start` starts it with the same ones. ValueError
    for a tick the runner would refuse (the unit would restart it every 15 s, forever)."""
    if parse_duration(str(tick)) <= 0:
        raise ValueError(f"--tick must be above 0: {tick!r}")
    return ["--tick", str(tick), *(["--cgroup", "auto"] if cgroup else [])]


def unit_text(
    root: str,
    python: str,
    pythonpath: str,
    user: str | None = None,
    tick: str = "10",
    wanted_by: str = "multi-user.target",
) -> str:
    """Restart=always, KillMode=control-group (a job's leftovers die with the unit), LimitMEMLOCK=infinity
    (jobs inherit the runner's limits, and the NPU runtime needs it), Delegate=yes (a cgroup subtree)."""
    user_line = f"User={_specifiers(user)}\n" if user else ""
    return f"""[Unit]
Description=plancompiler queue runner ({_specifiers(root)})
Wants=network-online.target
After=network-online.target

[Service]
{user_line}Environment={_word("PYTHONPATH=" + pythonpath, command=False)}
ExecStart={_word(python)} -u -m runner run --root {_word(root)} {" ".join(_word(f) for f in run_flags(tick))}
Restart=always
RestartSec=15
KillMode=control-group
TimeoutStopSec=30
LimitMEMLOCK=infinity
Delegate=yes

[Install]
WantedBy={wanted_by}
"""
