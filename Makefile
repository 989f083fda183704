# Two entry points a newcomer needs: `make demo` and `make test`. Both set everything up first.
# `make test-fast` is the edit-run loop: unit and property tests without those marked slow.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PYTEST_ARGS ?=
# pytest-xdist workers (auto: one per core; 0: one process, no xdist). tests/conftest.py
# keeps each integration module, and the Spark tier, on one worker (--dist loadscope).
JOBS    ?= auto
XDIST   := -n $(JOBS) --dist loadscope
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

.PHONY: setup system-deps venv qdrouterd demo test test-fast sanitize lint bench dist deb clean

setup: system-deps venv

# Debian packages: libsasl2-dev must be present before python-qpid-proton is built so that
# proton links Cyrus SASL (server-side PLAIN in the in-tree broker); the rest are test peers
# and tools (RabbitMQ, HAProxy, promtool/prometheus).
system-deps:
	@scripts/install-system-deps.sh

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python
	@scripts/install-python-deps.sh $(BIN)

demo: setup
	$(BIN)/amqp-policy-proxy demo

# The real qdrouterd of the test suite's real-router tier, built once into a cache directory
# from the shared qdrouterd sources (skipped with a note when they are not there).
qdrouterd:
	@scripts/install-qdrouterd.sh

test: setup qdrouterd
	$(BIN)/ruff check src tests bench
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

# Unit and property tests minus `slow` (under a minute on 2 cores): no real peers, no Spark.
test-fast: setup
	$(BIN)/python -m pytest $(XDIST) -m "not slow" tests/unit tests/property $(PYTEST_ARGS)

# The C accelerator built with ASan and UBSan (build/sanitize/), and the accelerator, amqp,
# core and property tests against it (CI runs it after `make test`; about 2 minutes on 2 cores).
sanitize: venv
	@scripts/sanitize.sh $(BIN) $(XDIST) $(PYTEST_ARGS)

# ruff, then mypy over src ([tool.mypy] in pyproject.toml: amqp, core and policy --strict)
lint: venv
	$(BIN)/ruff check src tests bench fuzz
	$(BIN)/mypy src

bench: setup
	$(BIN)/python bench/run_all.py

# sdist and wheel in dist/ (the wheel carries the demo policy; the sdist also carries
# debian/, systemd/, examples/ and docs/, which `make deb` builds from).
dist: venv
	rm -f dist/amqp_policy_proxy-$(VERSION).tar.gz dist/amqp_policy_proxy-$(VERSION)-*.whl
	$(BIN)/python -m build --outdir dist .

# Debian package (dh-virtualenv) built from the sdist: dist/amqp-policy-proxy_<version>_<arch>.deb
deb: system-deps dist
	scripts/build-deb.sh dist/amqp_policy_proxy-$(VERSION).tar.gz dist build/deb

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
