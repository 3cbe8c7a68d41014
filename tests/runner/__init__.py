"""The runner: job files, the scheduler, ticks driven in-process, real runner processes, stamps."""
