# clockmesh: the two commands a fresh Debian/Ubuntu machine needs, as root:
#   make demo   build the lab, deploy with Ansible, show live fleet health, inject a flap, show it found
#   make test   the whole suite (lint, rootless tests in parallel, then lab and molecule tests)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the demo needs (ssh per lab host, iproute2 for namespaces, tc and nft for
# faults, FRR for the fabric's BGP/BFD) and what the tests add (promtool to check
# /metrics, chromium to render reports, a one-node Slurm for the drain tests).
APT_DEMO := iproute2 openssh-server openssh-client python3-venv procps util-linux \
	psmisc rsync sshpass frr nftables
APT_TEST := prometheus chromium munge slurmctld slurmd slurm-client

.PHONY: help deps venv venv-demo demo demo-tui demo-down test lint unit clean

help:
	@echo "make demo   build the lab, deploy with Ansible, show live fleet health, inject a flap and show it found (root)"
	@echo "make test   run the whole suite: lint, unit, lab and molecule tests (root)"
	@echo "make lint   ruff, mypy, ansible-lint only"
	@echo "make unit   the rootless tests only, in parallel (no root, no lab)"
	@echo "make demo-tui   the TUI on the demo lab (fleet, anomalies, drill-downs, remediation)"
	@echo "make demo-down  tear the demo lab down"

# apt-get install what is missing of $(1)
define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages: $$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
endef

deps: $(VENV)/.deps-apt
$(VENV)/.deps-demo:
	@mkdir -p $(VENV)
	$(call apt_install,$(APT_DEMO))
	@touch $@
$(VENV)/.deps-apt: $(VENV)/.deps-demo
	$(call apt_install,$(APT_TEST))
	@touch $@

# The demo installs only what it runs; the tests add the linters, pytest and molecule.
venv-demo: $(VENV)/.installed-demo
$(VENV)/.installed-demo: pyproject.toml $(VENV)/.deps-demo
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[demo]'
	@touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml $(VENV)/.deps-apt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@ $(VENV)/.installed-demo

demo: venv-demo
	$(BIN)/clockmesh lab up --name demo
	$(BIN)/ansible-playbook -i .lab/demo/inventory.yml playbooks/deploy.yml
	$(BIN)/clockmesh live --inventory .lab/demo/inventory.yml --wait-hosts 16 --timeout 90
	@echo "injecting a fault: the link leaf2-spine1 flaps (3 s down, 5 s up, twice); no host counter sees it"
	$(BIN)/clockmesh lab flap --name demo leaf2-spine1 --down 3s --up 5s --count 2 & \
	$(BIN)/clockmesh live --inventory .lab/demo/inventory.yml --wait-anomaly flapping_link --timeout 60; \
	found=$$?; echo "the flap goes on (its second down 8 s after the first): waiting for it to end"; \
	wait $$!; exit $$found
	$(BIN)/clockmesh lab status --name demo --wait 60 > /dev/null
	@echo "next: make demo-tui (the TUI on this lab); make demo-down removes the lab"

# The TUI against the demo lab's ops box: its daemon over HTTP, its store as mounted here.
DEMO_URL = $(shell sed -n 's/^ *clockmesh_ingest_url: *//p' .lab/demo/inventory.yml 2>/dev/null)
demo-tui: venv-demo
	@test -n "$(DEMO_URL)" || { echo "no demo lab: run make demo first"; exit 1; }
	$(BIN)/clockmesh tui --url $(DEMO_URL) --store .lab/demo/nodes/ops/var/store \
		--topology .lab/demo/topology.json -i .lab/demo/inventory.yml

demo-down: venv-demo
	$(BIN)/clockmesh lab down --name demo

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/ansible-lint

# The suite in two runs, each with its own pytest summary line: the rootless tests in
# parallel (pytest-xdist, one worker per core of the 2-core CI machine), then the tests
# marked root/lab/molecule one at a time (they build namespaces, labs and deploy with
# Ansible: they share the machine's FRR, sshd and CPU, and time their own convergence).
# Both always run; make fails if either failed. tests/conftest.py keeps the marks honest.
PYTEST_SERIAL := root or lab or molecule
test: lint
	@rc=0; \
	$(BIN)/pytest -n 2 -m "not ($(PYTEST_SERIAL))" || rc=$$?; \
	$(BIN)/pytest -m "$(PYTEST_SERIAL)" || rc=$$?; \
	exit $$rc

# The fast rootless half only (no lint): what to run while working.
unit: venv
	$(BIN)/pytest -n 2 -m "not ($(PYTEST_SERIAL))"

clean:
	rm -rf $(VENV) .wheelhouse build *.egg-info
