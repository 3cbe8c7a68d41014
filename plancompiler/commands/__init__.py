"""What the `plan` commands do beyond compiling and pushing, one module per command group (the command line in
plancompiler/cli.py parses, calls these, and prints): operate (park, unpark, retry, cancel, logs, bootstrap,
hooks), run (`plan run`: a local queue and the bundled runner), write (`plan render -o DIR`)."""
