"""The workstation side: typed plans compiled to checked job files, pushed to a queue, watched and reported."""

__version__ = "0.1.0"
