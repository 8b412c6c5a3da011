# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: serve test install check-java check-node check-redis clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall only when the project's dependency list changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "Java 17 was not found on PATH. The router runs without it, but its Spark analytics"; \
	  echo "(PySpark through RayDP) need a Java 17 runtime: install openjdk-17-jre-headless."; }

serve: install check-java
	$(BIN)/router serve $(ARGS)

check-node:
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { \
	  echo "Node.js and npm were not found on PATH: the tests that run the real JavaScript SDKs"; \
	  echo "(cashu-ts, baqend, protobufjs) will fail. Install Node.js 18+ with npm."; }

# `router bench` measures Redis pub/sub beside the router (tests/e2e/test_bench.py too): Debian's
# redis-server, installed here when it is missing and this user may; else the baseline is skipped.
check-redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing redis-server (the Redis baseline of router bench)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null 2>&1 \
	      || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null 2>&1; } \
	      || echo "could not install redis-server: router bench skips its Redis baseline"; \
	  else \
	    echo "redis-server was not found on PATH: router bench skips its Redis baseline (apt-get install redis-server)"; \
	  fi; }

test: install check-java check-node check-redis
	$(BIN)/python -m pytest $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
