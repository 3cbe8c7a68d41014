"""The host side of a `backend: slurm` host: its ledger, pushes, attempts and views.

Doors: `runner.slurm.agent` (the agent's Slurm handlers), `runner.slurm.attempt` (`python3 -m runner.slurm.attempt`,
one attempt inside its allocation), `runner.slurm.ledger` and `runner.slurm.wrapper` (the ledger's and bundle's
formats), `runner.slurm.request` and `runner.slurm.statusitems` (the push request and the status answer, as the
workstation writes the one and reads the other). Nothing is imported here, so that an attempt loads only what it
uses."""
