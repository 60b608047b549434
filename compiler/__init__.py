"""runbook-compiler: a YAML spec of a GPU-environment move -> an auditable, linted bash runbook."""

__version__ = "0.1.0"
