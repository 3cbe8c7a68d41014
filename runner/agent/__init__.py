"""The host side of `plan`, `python3 -m runner agent MODE ROOT`: JSON in and out.

Doors: `runner.agent.dispatch` (`main`, `answer`: a request to its handler), `runner.agent.delivery` (a push's
probe and install), `runner.agent.bootstrap` (the runner installed under a root; `detach` starts it without
systemd), `runner.agent.unit` (the systemd unit, for `plan bootstrap` and `runner unit`). Nothing is imported here, so
that a Slurm attempt or the runner loads none of it."""
