"""The compiler: load, expand, graph, render, lint, the escaper, and the plans in plans/."""
