# The README's two commands: `make run` (set up, compile, run the embedded default spec here)
# and `make test` (set up, lint and format-check with ruff, run every test). .ci/run calls `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -Eeuo pipefail -c
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch 2.13.0 CPU lies on this machine's disk: pinned, so pip never downloads a CUDA build.
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: setup system-packages run test check regen clean reliability

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check '$(TORCH)'
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# Tools the runbooks and the end-to-end tests use: sshd for the test hosts, zstd, lz4, iproute2,
# ClusterShell, Slurm (slurmctld, slurmd, client) and munge for the fan-out tests' mini-cluster,
# chromium for the tests that open report.html in a browser.
system-packages:
	@missing=(); \
	for pair in sshd:openssh-server ssh:openssh-client zstd:zstd ip:iproute2 mkfs.ext4:e2fsprogs lz4:lz4 clush:clustershell \
	    slurmctld:slurmctld slurmd:slurmd srun:slurm-client munged:munge chromium:chromium; do \
	  command -v "$${pair%%:*}" >/dev/null || [[ -x /usr/sbin/$${pair%%:*} ]] || missing+=("$${pair#*:}"); \
	done; \
	if (( $${#missing[@]} )); then \
	  echo "installing: $${missing[*]}"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$${missing[@]}" >/dev/null; \
	fi

run: setup
	$(PY) -m compiler specs/local.yaml
	bash generated/local.sh

test: setup system-packages
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m compiler --check
	$(PY) -m pytest -q $(PYTEST_ARGS)

check: setup
	$(PY) -m compiler --check

regen: setup
	$(PY) -m compiler --schema > docs/spec.schema.json
	$(PY) -m compiler specs/
	$(PY) -m pytest -q tests/compiler/test_golden.py --update-golden

clean:
	rm -rf runs/ .pytest_cache

# docs/reliability.md from the hostile-input and fault tests' results.
reliability: setup system-packages
	$(PY) -m tests.reliability
