# Ferry: the two commands README opens with are `make demo` and `make test`.
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
BIN := $(CURDIR)/build/cni-bin
export PATH := $(VENV)/bin:$(PATH)

.PHONY: install bin test test-unit demo demo-down bench lint dist clean

install:
	bash .ci/install.sh

# Lean launchers for the per-Pod executables (ferry, ferry-ipam) plus the Go reference
# plugins, in one CNI_PATH directory.
bin: install
	$(PY) -m cni.launcher $(BIN)

test: bin
	bash .ci/test.sh

test-unit: install
	$(PY) -m pytest -q -m "not root" tests

demo: bin
	$(VENV)/bin/ferry-lab demo --cni-bin $(BIN)

demo-down:
	$(VENV)/bin/ferry-lab down

bench: bin
	$(PY) -m bench --cni-bin $(BIN)

lint:
	$(VENV)/bin/ruff check cni ipam routesync lab bench tests

clean:
	rm -rf build dist .pytest_cache
