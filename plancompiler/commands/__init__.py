"""What the `plan` commands do beyond compiling and pushing, one module per command group (the command line in
plancompiler/cli parses, calls these, and prints): operate (park, unpark, hold, release, move, retry, cancel,
logs, bootstrap, hooks), add (`plan add`: one job from the command line), run (`plan run`: a local queue and the
bundled runner), write (`plan render -o DIR`)."""
