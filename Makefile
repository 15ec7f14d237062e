# gpu-scheduler: `make demo` runs the seed on a local control plane; `make test` runs the tests.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# The versions the local stack builds and runs (localcp/versions.env holds the defaults: Kubernetes
# v1.37.2, JobSet v0.11.1, LeaderWorkerSet v0.8.0, Kueue v0.17.0): `make demo K8S=v1.33.13`,
# `make test K8S=v1.35.4 JOBSET=v0.10.1 LWS=v0.7.0`. Each version is built once into a directory of
# its own under ~/.cache/gpu-scheduler, beside the others. Passed on as the environment variables
# the scripts and localcp/*.py read (set directly, they work as well).
K8S ?=
JOBSET ?=
LWS ?=
KUEUE ?=
ifneq ($(K8S),)
export GPU_SCHEDULER_K8S := $(K8S)
endif
ifneq ($(JOBSET),)
export GPU_SCHEDULER_JOBSET := $(JOBSET)
endif
ifneq ($(LWS),)
export GPU_SCHEDULER_LWS := $(LWS)
endif
ifneq ($(KUEUE),)
export GPU_SCHEDULER_KUEUE := $(KUEUE)
endif
# make demo WORKLOAD=jobset|lws|kueue: that controller, built (once) for the demo
DEMO_CONTROLLERS := $(filter jobset lws kueue,$(WORKLOAD))

.PHONY: demo test unit venv stack controlplane workloads bench test-compat install manifests release clean
.DEFAULT_GOAL := demo

$(VENV)/.installed: requirements-dev.txt functions/bind/requirements.txt functions/mutate/requirements.txt pyproject.toml
	@command -v python3 >/dev/null || { echo "python3 is required"; exit 1; }
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt -e .
	@touch $@

venv: $(VENV)/.installed

stack:  ## build what a stack runs, at K8S (once, cached): Kubernetes and its DRA test driver (1.34+), etcd, containerd, runc, CNI plugins, kube-proxy, nft, CoreDNS, Knative Eventing (its receive adapter), the images' base
	@bash localcp/build.sh --stack

controlplane:  ## build everything make test and make bench use (once, cached): the stack's parts, helm, the workload controllers, Argo CD's CRDs, Knative Serving
	@bash localcp/build.sh

workloads:  ## build the JobSet, LeaderWorkerSet and Kueue controllers at JOBSET, LWS, KUEUE (once, cached)
	@bash localcp/build-workloads.sh

demo: venv stack  ## the seed StatefulSet, placed on the local control plane (KNATIVE=1: on real Knative Eventing and Serving, driven by the real ApiServerSource and PingSource: bind and mutate put on Knative by func deploy, the rest by the chart, kn's listings, func invoke with the captured events; KNATIVE=1 ZERO=1: the chart's Knative Services, bind scaled to zero and woken by the seed; DRA=1: in DRA mode, through the test driver; GANG=1: as a gang, blocked whole by a held GPU, then placed whole; PREEMPT=1: at high priority, preempting a low-priority holder; WORKLOAD=jobset or WORKLOAD=lws: instead of the seed, examples/jobset-torchrun.yaml or examples/lws-vllm.yaml run by the real JobSet or LeaderWorkerSet controller, with the check container; WORKLOAD=deployment: examples/deployment-vllm.yaml with the check container, a pool of 4 entries: each pod's entry, node, devices and log line, then a rollout (maxSurge 0) and the new pods the same way; WORKLOAD=kueue: two pinned Jobs of examples/kueue/ through the real Kueue, one ClusterQueue of 8 GPUs: the second waits until the first is deleted)
	$(if $(DEMO_CONTROLLERS),@bash localcp/build-workloads.sh $(DEMO_CONTROLLERS))
	$(PY) -m localcp.demo $(if $(DRA),--dra,) $(if $(GANG),--gang,) $(if $(PREEMPT),--preempt,) $(if $(WORKLOAD),--workload $(WORKLOAD),) $(if $(KNATIVE),--knative,) $(if $(ZERO),--zero,)

test: venv controlplane  ## every test: unit, HTTP, offline manifests, and the local control plane
	$(PY) -m pytest $(PYTEST_ARGS)

unit: venv  ## the tests that need no control plane
	$(PY) -m pytest -m "not controlplane" $(PYTEST_ARGS)

bench: venv controlplane  ## benchmarks on the local control plane (SMOKE=1: small and quick; NO_REAL_NODES=1: skip the four real nodes; SCALE=1: 1000 nodes, 20000 pods)
	$(PY) -m bench.run $(if $(SMOKE),--smoke,) $(if $(NO_REAL_NODES),--no-real-nodes,) $(if $(SCALE),--scale,)

# VERSIONS=v1.33.13,v1.37.2 and FEATURES=fit,gangs (names: python -m localcp.compat --list) run a
# subset, whose page goes to ~/.cache/gpu-scheduler/compat/ rather than docs/compatibility.md.
VERSIONS ?=
FEATURES ?=
test-compat: venv  ## the cluster tests feature by feature on each Kubernetes minor 1.33 to 1.37 (each built once), and on JobSet v0.10.1 / LWS v0.7.0: docs/compatibility.md
	$(PY) -m localcp.compat $(if $(VERSIONS),--versions $(VERSIONS)) $(if $(FEATURES),--features $(FEATURES))

# The chart on the cluster of your kubectl context (docs/install.md): Knative Serving and
# Eventing and cert-manager must be there. VALUES: your values file (at least the two images).
HELM ?= $(firstword $(shell command -v helm) $(wildcard $(shell bash localcp/build-helm.sh --path)))
RELEASE ?= gpu-scheduler
INSTALL_NAMESPACE ?= gpu-scheduler
VALUES ?=
install:  ## helm upgrade --install the chart (VALUES=my-values.yaml, INSTALL_NAMESPACE, RELEASE)
	@[ -n "$(HELM)" ] || { echo "helm is required: install it, or build it with bash localcp/build-helm.sh"; exit 1; }
	@[ -n "$(VALUES)" ] || { echo "VALUES=<your values file> is required: it names your images (docs/install.md)"; exit 1; }
	$(HELM) upgrade --install $(RELEASE) chart/gpu-scheduler --namespace $(INSTALL_NAMESPACE) --create-namespace -f $(VALUES)

manifests: venv  ## knative/*.yaml and functions/*/func.yaml, rendered from the chart with kind/values.yaml
	bash localcp/build-helm.sh
	$(PY) chart/manifests.py

# A release's files, built into dist/ (docs/plugin-release.md). VERSION must be pyproject.toml's,
# the one place the version is kept, and have an entry in CHANGELOG.md. RELEASE_URL: where the files
# will be downloadable, which the chart index and the krew manifest point at (default
# https://github.com/OWNER/gpu-scheduler/releases/download/vVERSION: set yours); IMAGE_REGISTRY: what
# the images' names start with (default localhost).
VERSION ?=
RELEASE_URL ?=
IMAGE_REGISTRY ?=
ifneq ($(filter release,$(MAKECMDGOALS)),)
ifeq ($(VERSION),)
$(error VERSION=x.y.z is required for make release: pyproject.toml's version, with an entry in CHANGELOG.md)
endif
endif
release: venv  ## dist/: the chart package and repository index, the images as OCI archives, the plugin's wheel, krew archive and manifest, release notes from CHANGELOG.md, SHA256SUMS (VERSION=x.y.z: pyproject's; RELEASE_URL, IMAGE_REGISTRY)
	$(PY) -m release.build --version '$(VERSION)' --out dist $(if $(RELEASE_URL),--url '$(RELEASE_URL)') \
		$(if $(IMAGE_REGISTRY),--image-registry '$(IMAGE_REGISTRY)') $(if $(HELM),--helm '$(HELM)')

# KinD + Knative: up, kind-up, images, deploy, check, verify, down (needs Docker; see docs/kind.md)
include kind/kind.mk

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
