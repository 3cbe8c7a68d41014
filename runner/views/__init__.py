"""What a person reads of a queue: the waiting queue grouped (waiting, a view model) and status.json laid out as
a screen (status), shared by `runner status`, `plan status`, `plan watch` and `plan top`.

Doors: `runner.views.status` and `runner.views.waiting`. Nothing is imported here."""
