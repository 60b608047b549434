"""rbkit: the file-system tools a runbook ships to every host (stdlib only, Python >= 3.9).

Relative imports only: on a host this package is named `rbkit` (see docs/design.md).
"""
