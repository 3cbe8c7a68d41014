"""The systemd unit that runs this runner (for `runner unit` and `plan bootstrap`)."""
from __future__ import annotations


def unit_text(root: str, python: str, pythonpath: str, user: str | None = None, tick: str = "10",
              wanted_by: str = "multi-user.target") -> str:
    """Restart=always, KillMode=control-group (a job's leftovers die with the unit), LimitMEMLOCK=infinity
    (jobs inherit the runner's limits, and the NPU runtime needs it), Delegate=yes (a cgroup subtree)."""
    user_line = f"User={user}\n" if user else ""
    return f"""[Unit]
Description=plancompiler queue runner ({root})
Wants=network-online.target
After=network-online.target

[Service]
{user_line}Environment=PYTHONPATH={pythonpath}
ExecStart={python} -u -m runner run --root {root} --tick {tick} --cgroup auto
Restart=always
RestartSec=15
KillMode=control-group
TimeoutStopSec=30
LimitMEMLOCK=infinity
Delegate=yes

[Install]
WantedBy={wanted_by}
"""
