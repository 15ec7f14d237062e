# KinD + Knative targets, included from the root Makefile (`include kind/kind.mk`); recipes run
# from the repository root. `make up` does it all in order; see docs/kind.md.
#   make kind-up  cluster, API server DNS, cert-manager, Knative Serving + Kourier + Eventing
#   make images   build bind/mutate/check images and load them into the kind nodes
#   make deploy   the chart (chart/gpu-scheduler) with kind/values.yaml and the loaded images:
#                 RBAC, the two functions, the event sources and the webhook registration
#   make check    the seed StatefulSet; writes kind/check-output.txt
#   make verify   checks every link of the chain, one PASS/FAIL each
#   make down     deletes the cluster
KIND_CLUSTER ?= gpu-scheduler
KIND_REGISTRY ?= kind.local
KIND_FUNCTION_TAG ?= dev
BIND_IMAGE ?= $(KIND_REGISTRY)/gpu-scheduler-bind:$(KIND_FUNCTION_TAG)
MUTATE_IMAGE ?= $(KIND_REGISTRY)/gpu-scheduler-mutate:$(KIND_FUNCTION_TAG)
CHECK_IMAGE ?= $(KIND_REGISTRY)/gpu-scheduler-check:latest

KIND_ENV = KIND_CLUSTER='$(KIND_CLUSTER)' BIND_IMAGE='$(BIND_IMAGE)' MUTATE_IMAGE='$(MUTATE_IMAGE)' \
	CHECK_IMAGE='$(CHECK_IMAGE)'
KIND_MAKE = $(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST))

.PHONY: up kind-up images deploy check verify down

# In order, also under make -j: each step needs the one before.
up:
	$(KIND_MAKE) kind-up
	$(KIND_MAKE) images
	$(KIND_MAKE) deploy
	$(KIND_MAKE) check
	$(KIND_MAKE) verify

kind-up:
	$(KIND_ENV) bash kind/kind-up.sh

images:
	$(KIND_ENV) bash kind/images.sh

deploy:
	$(KIND_ENV) bash kind/deploy.sh

check:
	$(KIND_ENV) bash kind/check.sh

verify:
	$(KIND_ENV) bash kind/verify.sh

down:
	$(KIND_ENV) bash kind/down.sh
