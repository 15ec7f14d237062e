# gpu-scheduler: `make demo` runs the seed on a local control plane; `make test` runs the tests.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test unit venv controlplane bench clean
.DEFAULT_GOAL := demo

$(VENV)/.installed: requirements-dev.txt functions/bind/requirements.txt functions/mutate/requirements.txt pyproject.toml
	@command -v python3 >/dev/null || { echo "python3 is required"; exit 1; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt -e .
	@touch $@

venv: $(VENV)/.installed

controlplane:  ## build Kubernetes 1.34, fetch etcd, containerd, runc, CNI plugins (once, cached)
	@bash localcp/build.sh

demo: venv controlplane  ## the seed StatefulSet, placed on the local control plane
	$(PY) -m localcp.demo

test: venv controlplane  ## every test: unit, HTTP, offline manifests, and the local control plane
	$(PY) -m pytest $(PYTEST_ARGS)

unit: venv  ## the tests that need no control plane
	$(PY) -m pytest -m "not controlplane" $(PYTEST_ARGS)

bench: venv controlplane  ## benchmarks on the local control plane (SMOKE=1: small and quick; NO_REAL_NODES=1: skip the four real nodes)
	$(PY) -m bench.run $(if $(SMOKE),--smoke,) $(if $(NO_REAL_NODES),--no-real-nodes,)

# KinD + Knative: up, kind-up, images, deploy, check, verify, down (needs Docker; see README)
include kind/kind.mk

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
