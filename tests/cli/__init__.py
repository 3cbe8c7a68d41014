"""The `plan` command line: its messages and exit codes, the light reader, `plan run` and the git hook."""
