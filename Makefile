# The two quickstart commands: `make demo` (a local fleet on the embedded backend) and
# `make test` (the whole test suite). Both create .venv on first use. Below them, thin wrappers
# for SAM users: `sam local invoke` against the embedded backend, and image / push / deploy
# (these need Docker, the AWS CLI and sam; README "Deploy to AWS").
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test unit integration lint-py demo up bench tradeoffs tradeoffs-render clean local-backend invoke image push deploy tune openapi dynalite

$(STAMP): requirements-dev.txt layers/wsfleet/pyproject.toml worker/pyproject.toml local/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -e layers/wsfleet -e worker -e local
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest tests

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration

# dynalite (npm), the second DynamoDB: into .dynalite/ (git-ignored; kept between runs). With it
# `make test` also runs the store's contract tests and a fleet test on it; without it they skip.
dynalite: $(STAMP)
	$(BIN)/python -m bench.dynalite --install

# Static Python checks: ruff's lint rules over the repository and mypy --strict over the shipped
# code (both configured in pyproject.toml), then a looser mypy pass over the local runtime and
# the benches (mypy-local.ini says why). All run even if one fails (.ci/lint calls this).
lint-py: $(STAMP)
	@status=0; \
	echo "ruff check ."; $(BIN)/ruff check . || status=1; \
	echo "mypy"; $(BIN)/mypy || status=1; \
	echo "mypy --config-file mypy-local.ini local/wsfleet_local bench"; \
	$(BIN)/mypy --config-file mypy-local.ini local/wsfleet_local bench || status=1; \
	exit $$status

demo: $(STAMP)
	$(BIN)/wsfleet demo

up: $(STAMP)
	$(BIN)/wsfleet local up

bench: $(STAMP)
	$(BIN)/python -m bench

# docs/tradeoffs.md and docs/tradeoffs.png: the tuning sweep (bench/tradeoffs.py, about 10-15
# minutes on 2 busy cores), or only their rendering from bench/results.json.
tradeoffs: $(STAMP)
	$(BIN)/python -m bench --only tradeoffs

tradeoffs-render: $(STAMP)
	$(BIN)/python -m bench.tradeoffs --render

# docs/openapi.json: the OpenAPI document the router's resolver builds (tests/unit/test_openapi.py
# fails when it is stale).
openapi: $(STAMP)
	WSFLEET_UPDATE_OPENAPI=1 $(BIN)/python -m pytest -q tests/unit/test_openapi.py

# ------------------------------------------------------------------ sam local invoke
# `make local-backend` in one shell (the tables and queues env.json names, on port 4566), then
# `make invoke FUNCTION=StreamNotifierFunction EVENT=stream_stop_modify` in another.
# samconfig.toml's [default.local_invoke.parameters] adds env.json and the endpoint.
FUNCTION ?= RouterFunction
EVENT    ?= api_post_events_start

local-backend: $(STAMP)
	$(BIN)/python -m wsfleet_local.backend --port 4566 --create-resources wsfleet --seed-samples

invoke:
	sam build
	sam local invoke $(FUNCTION) --event events/$(EVENT).json

# ------------------------------------------------------------------ image, push, deploy
# `make push deploy CONFIG_ENV=dev`: builds the worker image, pushes it to ECR and deploys
# the stack with it, by digest. The shell lookups run only when a target uses them.
CONFIG_ENV ?= dev
REPO       ?= wsfleet-worker
TAG        ?= $(shell git rev-parse --short HEAD)
REGION     ?= $(or $(AWS_REGION),$(AWS_DEFAULT_REGION),$(shell aws configure get region))
REGISTRY    = $(shell aws sts get-caller-identity --query Account --output text).dkr.ecr.$(REGION).amazonaws.com
# --region only when there is one (no region configured: the AWS CLI's and sam's own default
# chain decides, instead of an empty --region).
REGION_FLAG = $(if $(strip $(REGION)),--region $(REGION))
IMAGE       = $(REGISTRY)/$(REPO):$(TAG)
# Written by `make push`: the pushed image as <registry>/<repo>@sha256:<digest>.
IMAGE_URI_FILE := .worker-image-uri

image:
	docker build --platform linux/amd64 -f worker/Dockerfile -t $(REPO):$(TAG) .

push: image
	@test -n "$(strip $(REGION))" || { echo "make push: no region for the ECR registry (REGION=..., AWS_REGION or aws configure)" >&2; exit 2; }
	aws ecr get-login-password $(REGION_FLAG) | docker login --username AWS --password-stdin $(REGISTRY)
	docker tag $(REPO):$(TAG) $(IMAGE)
	docker push $(IMAGE)
	# The digest of this registry and repository (an image pushed to two has two).
	docker inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' $(IMAGE) \
	  | grep '^$(REGISTRY)/$(REPO)@sha256:' > $(IMAGE_URI_FILE)
	@echo "WorkerImageUri=$$(cat $(IMAGE_URI_FILE))"

# With $(IMAGE_URI_FILE) present (after `make push`) the stack gets that image; every other
# parameter keeps its deployed value (SAM sends UsePreviousValue for the ones not given).
# Without it: samconfig.toml's parameters as they are (the first deploy of a stack).
deploy:
	sam build
	sam deploy --config-env $(CONFIG_ENV) $(REGION_FLAG) \
	  $$(test -f $(IMAGE_URI_FILE) && echo --parameter-overrides WorkerImageUri=$$(cat $(IMAGE_URI_FILE)))

# `make tune STACK=wsfleet-prod SET="'ReconcileSchedule=rate(5 minutes)'"`: a parameter-only
# change (docs/deploy.md, "Change only the reconcile schedule"). CloudFormation's UpdateStack
# with the deployed template (no build, no upload: the code and image stay as deployed), SET's
# parameters changed and every other one UsePreviousValue. SET is shell words, one
# ParameterName=value each (quote a value with spaces).
STACK ?= wsfleet-$(CONFIG_ENV)
tune: $(STAMP)
	$(BIN)/python -m wsfleet_local.tune --stack-name $(STACK) $(REGION_FLAG) $(SET)

clean:
	rm -rf $(VENV) .aws-sam .pytest_cache $(IMAGE_URI_FILE)
