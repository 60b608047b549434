"""Benchmarks: our runbook's move against the physical limit and against the tools people use
instead.

One command, `python -m benchmarks [--quick] [--shape 1gbit] [--repeat N]`, builds the lab hosts
(tests/lab), the payload venvs, runs every row (a warm-up, then N timed rounds), checks that each
copy equals its source, prints the table and writes docs/benchmarks.md. See docs/benchmarks.md.
"""
