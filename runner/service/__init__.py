"""The runner service, `python3 -m runner run`: its parts wired together in `runner.service.runner.Runner`.

Door: `runner.service.runner` (`Runner`, `AlreadyRunning`); the parts (scan, facts, schedule, dispatch, jobs,
outcomes, reasons, announce, proctable, problems, manifest, statusfile, loop) are imported by the service and by
the tests that drive one part. Nothing is imported here."""
