"""`plan top`: every host's queue live on one screen, refreshed by `plan watch`'s bounded probes.

frame (the screen, a pure function of what the probes saw; waiting jobs grouped by runner.views.waiting, as plan status
groups them), probes (one probe thread per host), keys (what each key does), app (the loop). This is the door: the
command imports the names below, from `plancompiler.top`."""

from __future__ import annotations

from plancompiler.top.app import TopOptions, default_interval, run_top

__all__ = ["TopOptions", "default_interval", "run_top"]
