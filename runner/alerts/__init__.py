"""The box's alerting: the causes of trouble it judges (causes), the incident book it keeps (book), the notices
it sends and the dead-man's switch it pings (notify), wired into each tick (engine).

Doors: `runner.alerts.engine` (`Alerts`, for the service), `runner.alerts.book` (the book's file and shape,
`matching`, `known_kind`, `CAUSE_KINDS`: for the agent, `plan watch`, `plan ack`, `plan top`), `runner.alerts.notify`
(`Outbox`, `target`: also for `plan watch --notify`). Nothing is imported here: the runner loads urllib and a
thread only when it sends."""
