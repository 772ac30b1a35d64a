# trainyard — the two commands are `make demo` and `make test`.
SHELL := /bin/bash
CACHE ?= $(HOME)/.cache/trainyard
VENV  := $(CACHE)/venv
PY    := $(VENV)/bin/python
E2E_STATE ?= /var/lib/trainyard-e2e
CLUSTER_KUBECONFIG := $(E2E_STATE)/kubeconfig
CARGO ?= cargo
NODE2 := trainyard-node-2

.PHONY: test demo bench chaos prereqs lint unit chart-test e2e cluster-inputs crds images cluster-up cluster-down clean-cluster

## make help (the default: a bare `make` runs nothing): the targets and what they do.
.PHONY: help
help:
	@awk '/^## /{doc = doc "    " substr($$0, 4) "\n"; next} \
	  /^$$/{doc = ""} \
	  /^[a-z][a-z0-9-]*:/{split($$0, t, ":"); if (doc != "") printf "%s\n%s", t[1], doc; else rest = rest " " t[1]; doc = ""} \
	  END{print "also:" rest}' $(firstword $(MAKEFILE_LIST))

## make test: lint, unit and integration tests, chart tests, then the local
## cluster (built and started if needed) for the cluster and e2e tests.
## What the cluster needs and a warm cache keeps (Kubernetes built from source, the
## PyTorch layer, the Dockerfile's stand-in base images: cluster-inputs) is built
## beside lint, unit and chart-test, which do not need it: on a cold machine that
## is mostly downloads and Go while cargo compiles. Its log is printed once it is done.
test: prereqs
	@mkdir -p target; date +"make: cluster-inputs beside lint, unit and chart-test from %T (log: target/cluster-inputs.log)"
	@setsid $(MAKE) --no-print-directory cluster-inputs > target/cluster-inputs.log 2>&1 & inputs=$$!; \
	  $(MAKE) --no-print-directory lint unit chart-test; rc=$$?; \
	  if [ $$rc != 0 ]; then kill -TERM -- -$$inputs 2>/dev/null; wait $$inputs; exit $$rc; fi; \
	  wait $$inputs; irc=$$?; cat target/cluster-inputs.log; \
	  if [ $$irc != 0 ]; then echo "make: cluster-inputs failed (exit $$irc)" >&2; exit $$irc; fi
	@$(MAKE) --no-print-directory e2e

## Everything the local cluster needs that a warm cache keeps; each part is a no-op when cached.
cluster-inputs:
	@date +"make: cluster-inputs from %T"
	bash e2e/cluster/build-k8s.sh
	bash e2e/cluster/images.sh inputs
	@date +"make: cluster-inputs done at %T"

## make demo: the local cluster with 8 simulated GPUs, the chart, the example
## job, a preemption, and the resume. make demo ELASTIC=1: the elastic job
## shrinks to the workers left when its spot node is lost, and grows back.
## On a cold machine the cluster's inputs (Kubernetes from source, the PyTorch layer, the
## stand-in base images: mostly downloads and Go) are built beside the cargo build.
demo: prereqs
	@mkdir -p target; date +"make: cluster-inputs beside the cargo build from %T (log: target/cluster-inputs.log)"
	@setsid $(MAKE) --no-print-directory cluster-inputs > target/cluster-inputs.log 2>&1 & inputs=$$!; \
	  $(CARGO) build --workspace --bins; rc=$$?; \
	  if [ $$rc != 0 ]; then kill -TERM -- -$$inputs 2>/dev/null; wait $$inputs; exit $$rc; fi; \
	  wait $$inputs; irc=$$?; \
	  if [ $$irc != 0 ]; then cat target/cluster-inputs.log; echo "make: cluster-inputs failed (exit $$irc)" >&2; exit $$irc; fi
	bash e2e/$(if $(ELASTIC),demo-elastic.sh,demo.sh)

## make bench: every figure in docs/benchmarks.md.
bench: prereqs
	bash bench/run.sh

## make chaos: CHAOS_SEEDS seeded chaos runs of CHAOS_FAULTS faults each on the local cluster
## (e2e/tests/chaos.rs); docs/reliability.md gets their results table, passed or not.
## CHAOS_FIRST_SEED=N runs seeds N..CHAOS_SEEDS and keeps the results of the seeds before N.
CHAOS_SEEDS ?= 20
CHAOS_FAULTS ?= 12
CHAOS_FIRST_SEED ?= 1
chaos: prereqs
	$(CARGO) build --workspace --bins
	mkdir -p target/chaos && if [ "$(CHAOS_FIRST_SEED)" = 1 ]; then rm -f target/chaos/results.jsonl; fi
	CARGO=$(CARGO) FIRST_SEED=$(CHAOS_FIRST_SEED) bash e2e/with-cluster.sh bash e2e/chaos-seeds.sh $(CHAOS_SEEDS) $(CHAOS_FAULTS); \
	  rc=$$?; python3 e2e/chaos_report.py target/chaos/results.jsonl docs/reliability.md; exit $$rc

## Rust itself is not installed here (see README): say so before anything else runs.
prereqs:
	@date +"make: prereqs from %T"
	@command -v $(CARGO) >/dev/null || { echo "prereqs: no $(CARGO): install a Rust toolchain (1.89+, e.g. with rustup) first" >&2; exit 1; }
	bash e2e/cluster/install-prereqs.sh
	rustup component add rustfmt clippy >/dev/null 2>&1 || true
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -r charts/tests/requirements.txt

lint:
	@date +"make: lint from %T"
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

unit:
	@date +"make: unit from %T"
	$(CARGO) test --workspace

chart-test:
	@date +"make: chart-test from %T"
	$(VENV)/bin/pytest -q charts/tests examples/tests e2e/pytests
	promtool test rules charts/tests/prometheus-rules/*.test.yaml

## Cluster tests are #[ignore]d in plain `cargo test`; here they run against the
## local cluster. The cluster is stopped afterwards, also when a test fails.
## Component tests (in-process operator, fake nodes) run first; the Helm
## scenarios last, since the chart's operator watches every namespace. The spot
## node (node 2) is cordoned for all but the two-node scenarios, which uncordon it.
## The dashboard test runs after the scenarios: it queries what Prometheus scraped during them.
## The host's own services are checked around it: stand-ins on containerd's default socket and
## etcd's and Prometheus' default ports (e2e/cluster/host-guard.sh) must still answer afterwards.
e2e:
	@date +"make: e2e from %T"
	$(CARGO) build --workspace --bins
	bash e2e/cluster/host-guard.sh start
	bash e2e/with-cluster.sh bash -c 'kubectl cordon $(NODE2) >/dev/null && $(CARGO) test --workspace --exclude trainyard-e2e --tests -- --ignored --skip nvml_ --test-threads 3 && $(CARGO) test -p trainyard-e2e --tests -- --ignored --skip dashboard_ --skip figures_ && $(CARGO) test -p trainyard-e2e --test dashboard -- --ignored'; \
	  rc=$$?; bash e2e/cluster/host-guard.sh check || rc=1; exit $$rc

crds:
	$(CARGO) run -q -p trainyard-operator -- crd > crds/trainingjob.yaml
	cp crds/trainingjob.yaml charts/trainyard/crds/trainingjob.yaml

## make images: the e2e images, built and imported into the local cluster's containerd.
## make images REGISTRY=registry.example.com/trainyard [VERSION=0.1.0]: the operator and
## device-plugin images for a real cluster instead, on the real base images, pushed as
## $REGISTRY/trainyard-operator:$VERSION and $REGISTRY/trainyard-device-plugin:$VERSION with
## docker, podman or buildah (ENGINE=, detected); prints their digests and the chart values
## that pin them (target/images/image-values.yaml). DRY_RUN=1 prints the commands alone.
REGISTRY ?=
images:
ifeq ($(strip $(REGISTRY)),)
	$(CARGO) build --workspace --bins
	bash e2e/cluster/images.sh all
else
	TRAINYARD_E2E_STATE=$(CURDIR)/target REGISTRY='$(REGISTRY)' VERSION='$(VERSION)' \
	  bash e2e/cluster/images.sh push
endif

cluster-up:
	bash e2e/cluster/up.sh
	@echo "export KUBECONFIG=$(CLUSTER_KUBECONFIG)"

cluster-down:
	bash e2e/cluster/down.sh
