# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: serve test install check-java check-node clean

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

test: install check-java check-node
	$(BIN)/python -m pytest $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
