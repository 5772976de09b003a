# Ferry: the two commands README opens with are `make demo` and `make test`.
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
BIN := $(CURDIR)/build/cni-bin
export PATH := $(VENV)/bin:$(PATH)

.PHONY: install bin test test-unit demo demo-down bench lint dist clean chaos

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

# Issue 10 at full size: 3 Nodes, 1,000 ADD/DEL from 16 workers, 100 SIGKILLs of plugin processes,
# route-sync killed 4 times, one ovs-vswitchd restart; prints the report (exit 1 on any leak).
chaos: bin
	$(PY) -m tests.chaos.run_chaos --ops 1000 --workers 16 --kills 100 --route-sync-restarts 4 --cni-bin $(BIN)

bench: bin
	$(PY) -m bench --cni-bin $(BIN) --docs docs

# The frozen onedir bundle (dist/ferry: ferry, ferry-ipam, ferry-route-sync, one _internal); see build.spec.
dist: install
	$(VENV)/bin/pyinstaller --noconfirm --log-level WARN --distpath $(CURDIR)/dist --workpath $(CURDIR)/build/pyi build.spec

lint:
	$(VENV)/bin/ruff check cni ipam routesync lab bench tests

clean:
	rm -rf build dist .pytest_cache
