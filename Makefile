# trainserve: train on GPUs, serve on CPUs, prove it works. `make help` lists every target.
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The one TensorFlow pin lives in pyproject.toml (the `cpu` extra); everything else reads it from there.
TF_VERSION ?= $(shell sed -n 's/.*"tensorflow-cpu==\([0-9.]*\)".*/\1/p' pyproject.toml)
MODEL_NAME ?= digits
DEMO_DIR ?= demo
DEMO_EPOCHS ?= 20
GRPC_PORT ?= 8500
REST_PORT ?= 8501
PYTEST_ARGS ?=
UV_VERSION ?= $(shell sed -n 's/.*"uv==\([0-9.]*\)".*/\1/p' pyproject.toml)
KUBERNETES_VERSION ?= 1.33.0

##@ Getting started

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} \
	/^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2 } \
	/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

.PHONY: venv
venv: $(VENV)/.installed $(VENV)/tools/.installed ## Create .venv from uv.lock: pinned TensorFlow (CPU build), serving protos, trainserve

# Every package comes from uv.lock (exact versions and hashes). pip bootstraps the pinned uv once; from then
# on uv is itself one of the locked packages. Byte code is compiled at install (--compile-bytecode): where
# PYTHONDONTWRITEBYTECODE is set (many CI images set it) no import ever writes it, and every process that
# imports TensorFlow would compile its 1,800 modules again (13 s instead of 6 s here); the stand-in images
# copy it too, so a read-only container starts without compiling.
$(VENV)/.installed: pyproject.toml uv.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -x $(BIN)/uv || $(BIN)/python -m pip install --quiet "uv==$(UV_VERSION)"
	UV_PROJECT_ENVIRONMENT=$(VENV) $(BIN)/uv sync --quiet --frozen --compile-bytecode \
		--extra cpu --extra train --extra serve --extra dev
	$(BIN)/python -c "import tensorflow as tf, tensorflow_serving.apis; assert tf.__version__ == '$(TF_VERSION)', tf.__version__"
	touch $@

# Manifest checkers live in their own venv, from their own lock: checkov's many pins must not move TensorFlow's.
$(VENV)/tools/.installed: $(VENV)/.installed requirements/tools.txt
	$(BIN)/python -m venv --without-pip $(VENV)/tools
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(VENV)/tools/bin/python --require-hashes \
		-r requirements/tools.txt
	touch $@

.PHONY: demo
demo: venv ## Whole pipeline on bundled data: train, publish, serve-local, eval (no Docker, no GPU)
	BIN=$(BIN) DEMO_DIR=$(DEMO_DIR) MODEL_NAME=$(MODEL_NAME) DEMO_EPOCHS=$(DEMO_EPOCHS) \
		GRPC_PORT=$(GRPC_PORT) REST_PORT=$(REST_PORT) scripts/demo.sh

.PHONY: examples
examples: venv ## Your own model: three examples/ (regression, two inputs, LSTM) trained, published, served, evaluated
	BIN=$(BIN) DEMO_DIR=$(DEMO_DIR) GRPC_PORT=$(GRPC_PORT) REST_PORT=$(REST_PORT) scripts/examples.sh

COMPARE_DIR ?= compare
COMPARE_EPOCHS ?= 5
COMPARE_TRAIN = --epochs $(COMPARE_EPOCHS) --model-name compare --seed 0

.PHONY: compare
compare: venv ## The same training on the CPU and, where an NVIDIA runtime exists, the GPU image; one table
	CUDA_VISIBLE_DEVICES=-1 $(BIN)/trainserve train $(COMPARE_TRAIN) --logs-dir $(COMPARE_DIR)/cpu \
		--export-base $(COMPARE_DIR)/models --data-dir $(COMPARE_DIR)/data
	if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia; then \
		$(COMPOSE) --profile train run --rm --user "$$(id -u):$$(id -g)" -v "$(abspath $(COMPARE_DIR)):/compare" \
			train-gpu $(COMPARE_TRAIN) --logs-dir /compare/gpu --export-base /compare/models --data-dir /compare/data; \
	else echo "make compare: no NVIDIA container runtime here: CPU run only" >&2; fi
	$(BIN)/trainserve runs $(COMPARE_DIR)/cpu $$(test -d $(COMPARE_DIR)/gpu && echo $(COMPARE_DIR)/gpu)

##@ Containers (Docker; GPU training needs the NVIDIA container toolkit)

# TLS=1: every compose target below with compose.tls.yaml on top (gRPC over mutual TLS; `make certs` first).
TLS ?=
# `docker compose` where the engine has the Compose plugin, else the Compose v2 binary `make venv` installs
# ($(BIN)/docker-compose: Debian's docker.io and many CI images have no plugin). Found on first use, said once on
# stderr; COMPOSE=... (the command line or the environment) overrides it and is used as given.
COMPOSE_FOUND = $(eval COMPOSE_FOUND := $$(shell $$(COMPOSE_FIND)))$(COMPOSE_FOUND)
COMPOSE_FIND = if docker compose version >/dev/null 2>&1; then echo "docker compose"; \
	echo "make: compose is docker compose" >&2; \
	else echo "$(BIN)/docker-compose"; echo "make: compose is $(BIN)/docker-compose (no docker compose plugin$(if \
	$(wildcard $(BIN)/docker-compose),,; make venv installs it))" >&2; fi
COMPOSE ?= $(COMPOSE_FOUND)$(if $(filter 1,$(TLS)), -f compose.yaml -f compose.tls.yaml)
REGISTRY ?=
CERTS_DIR ?= certs

.PHONY: images
images: ## Build the train-gpu, serve-cpu and eval images (official base images)
	$(COMPOSE) --profile train --profile eval build

.PHONY: train-gpu
train-gpu: ## Train on the GPUs in a container and publish a version to the `models` volume
	@docker info --format '{{json .Runtimes}}' | grep -q nvidia || { \
		echo "make train-gpu: this Docker engine has no NVIDIA runtime (install the NVIDIA container toolkit)," \
		"or train on the CPU instead: make train-cpu" >&2; exit 1; }
	$(COMPOSE) --profile train run --rm train-gpu

.PHONY: train-cpu
train-cpu: ## The same training without a GPU
	$(COMPOSE) --profile train run --rm train-cpu

.PHONY: serve
serve: ## Start serve-cpu (TF Serving) in the background; gRPC 127.0.0.1:8500, REST 127.0.0.1:8501
	$(COMPOSE) up -d serve-cpu

.PHONY: eval
eval: ## Evaluate the served model over gRPC; report in the `reports` volume
	$(COMPOSE) --profile eval run --rm eval

.PHONY: promote
promote: ## Gated rollout: candidate -> eval (non-inferior to stable by MAX_DROP, MIN_ACCURACY) -> stable only if it passed
	$(COMPOSE) --profile promote run --rm candidate
	$(COMPOSE) --profile promote run --rm promote-eval
	$(COMPOSE) --profile promote run --rm promote

.PHONY: traffic
traffic: ## Steady traffic for a rollout to judge: the proxy, Prometheus, and the `load` service calling `stable` through the proxy
	$(COMPOSE) --profile proxy --profile monitoring --profile load up -d proxy prometheus load

.PHONY: rollout
rollout: traffic ## Progressive rollout on live traffic through the proxy (its `traffic` started first): candidate -> gated eval -> shadow, canary steps judged by Prometheus -> stable, or rolled back
	$(COMPOSE) --profile promote run --rm rollout-candidate
	$(COMPOSE) --profile promote run --rm promote-eval
	$(COMPOSE) --profile promote run --rm rollout

.PHONY: rollback
rollback: ## Gated rollout: label `stable` back to the previous stable version (kept loaded)
	$(COMPOSE) --profile promote run --rm rollback

.PHONY: certs
certs: $(CERTS_DIR)/ca.crt ## DEVELOPMENT-only CA, server (localhost, 127.0.0.1, serve-cpu) and client certificates in certs/

$(CERTS_DIR)/ca.crt: | $(VENV)/.installed
	$(BIN)/python scripts/certs.py $(CERTS_DIR)

.PHONY: push
push: ## Tag and push the three images to REGISTRY (make push REGISTRY=registry.example.com/team)
	@test -n "$(REGISTRY)" || { echo "make push: set REGISTRY=host/path" >&2; exit 1; }
	for image in train-gpu serve-cpu eval; do \
		docker tag trainserve/$$image:$(TF_VERSION) $(REGISTRY)/trainserve-$$image:$(TF_VERSION); \
		docker push $(REGISTRY)/trainserve-$$image:$(TF_VERSION); \
	done

.PHONY: standins
standins: venv ## Build the local STAND-IN base images the e2e tests use (no registry needed; tests only)
	TF_VERSION=$(TF_VERSION) PYTHON=$(BIN)/python scripts/standins/build.sh

.PHONY: e2e
e2e: venv ## Only the e2e tier: a real Docker engine with stand-in bases (train -> serve -> eval -> v2, rollout)
	$(BIN)/python -m pytest -m e2e $(PYTEST_ARGS)

##@ Development

# The tiers (pytest markers) say what a test needs: unit (this process only), integration (subprocesses,
# sockets), e2e (a Docker engine). Tests run on 1.5 workers per core (pytest-xdist): about a fifth of the
# suite waits on servers, scrapes and the Docker engine, and a third worker fills that time (on 2 cores the
# whole suite took 707 s on 2 workers, 574 s on 3, 638 s on 4). The Docker tests share one worker
# (xdist_group "docker") so they do not fight over the engine. Groups go out in collection order (conftest.py
# puts e2e first), not xdist's default of the largest group first: that sent the Docker group, the suite's
# longest chain, out only once a worker had finished the monitoring, two-trainings or compare group.
PYTEST_WORKERS ?= $(shell echo $$(( ($$(nproc) * 3 + 1) / 2 )))
PYTEST_PARALLEL ?= -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder

.PHONY: test
test: venv ## Run the whole test suite: unit, integration (real TensorFlow, gRPC, serve-local), e2e (Docker)
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: venv ## Only the unit tier: in process and quick (a test over 4 s of CPU fails), no Docker: at most 90 s
	$(BIN)/python -m pytest -m unit $(PYTEST_PARALLEL) $(PYTEST_ARGS)

.PHONY: lint
lint: venv ## ruff, hadolint, yamllint, `docker compose config` for every profile (with and without TLS), promtool
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/hadolint images/*/Dockerfile scripts/standins/*.Dockerfile
	$(BIN)/yamllint compose.yaml compose.tls.yaml .yamllint.yaml monitoring
	promtool check rules monitoring/rules.yml
	promtool check config monitoring/prometheus.yml monitoring/prometheus-compose.yml
	for files in "-f compose.yaml" "-f compose.yaml -f compose.tls.yaml"; do \
		$(BIN)/docker-compose $$files config --quiet; \
		for profile in train eval promote proxy monitoring "proxy --profile load"; do \
			$(BIN)/docker-compose $$files --profile $$profile config --quiet; done; \
	done
	for dir in k8s/base k8s/overlays/*; do \
		kubectl kustomize $$dir > $(VENV)/rendered.yaml; \
		$(VENV)/tools/bin/kubernetes-validate --strict --quiet -k $(KUBERNETES_VERSION) $(VENV)/rendered.yaml; \
		$(VENV)/tools/bin/checkov -f $(VENV)/rendered.yaml --framework kubernetes --compact --quiet --skip-download; \
	done

.PHONY: docs
docs: venv ## The documentation site into site/: mkdocs build --strict (a broken link or anchor, or a page left out, fails)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

.PHONY: monitoring-rules
monitoring-rules: venv ## Regenerate k8s/components/monitoring/prometheusrule.yaml from monitoring/rules.yml
	$(BIN)/python scripts/prometheus_rule.py

.PHONY: bench
bench: venv ## Benchmarks (ratios against baselines, printed; never pass/fail)
	$(BIN)/python bench/loop.py
	$(BIN)/python bench/train_input.py
	$(BIN)/python bench/image_input.py
	$(BIN)/python bench/eval_throughput.py
	$(BIN)/python bench/tls_cost.py
	$(BIN)/python bench/serve_batching.py
	$(BIN)/python bench/compare_cost.py
	$(BIN)/python bench/capture_cost.py
	$(BIN)/python bench/soak_versions.py
	$(BIN)/python bench/promote_defaults.py
	$(BIN)/python bench/drift_false_alarms.py
	$(BIN)/python bench/live_eval.py
	$(BIN)/python bench/shadow_cost.py

# One export per image, from the same lock: eval is the core install (no TensorFlow); the GPU image keeps its
# base's TensorFlow (no tensorflow-cpu); serve.txt is serve-local with the CPU TensorFlow (the test stand-in).
EXPORT = $(BIN)/uv export --quiet --frozen --format requirements.txt --no-header --no-emit-project \
	--no-emit-package tensorflow

.PHONY: lock
lock: ## Re-resolve uv.lock after editing pyproject.toml, and re-export requirements/ (images, lint tools)
	$(BIN)/uv lock
	$(EXPORT) -o requirements/eval.txt
	$(EXPORT) --extra train --no-emit-package tensorflow-cpu -o requirements/train-gpu.txt
	$(EXPORT) --extra serve --extra cpu -o requirements/serve.txt
	$(BIN)/uv pip compile --quiet --generate-hashes --universal --python-version 3.11 \
		--custom-compile-command "make lock" requirements/tools.in -o requirements/tools.txt

.PHONY: protos
protos: venv ## Regenerate src/trainserve/protos/ (every TF Serving message trainserve uses) from the pinned tensorflow-serving-api
	$(BIN)/python scripts/generate_protos.py src/trainserve/protos

.PHONY: upgrade-deps
upgrade-deps: venv ## Scheduled upgrade: newest versions pyproject allows into the lock, then the whole test suite
	$(BIN)/uv lock --upgrade
	$(MAKE) lock
	$(MAKE) test

.PHONY: clean
clean: ## Remove demo output and caches (keeps .venv)
	rm -rf $(DEMO_DIR) .pytest_cache .ruff_cache
