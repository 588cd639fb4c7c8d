"""The experiment harness: task suites, methods built from configs, a resumable runner, tables.

`experiments/run.py` is the command-line entry point; everything it does lives here so that it can
be imported and tested.
"""
