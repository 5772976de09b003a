# Ferry: the two commands README opens with are `make demo` and `make test`.
VENV ?= $(CURDIR)/.venv
# The frozen bundle is built in its own venv on the distribution's optimised CPython (.ci/install.sh).
DIST_VENV ?= $(CURDIR)/.venv-dist
PY := $(VENV)/bin/python
BIN := $(CURDIR)/build/cni-bin
export PATH := $(VENV)/bin:$(PATH)
# .ci/install.sh and .ci/test.sh read the venvs' paths from these.
export FERRY_VENV := $(VENV)
export FERRY_DIST_VENV := $(DIST_VENV)
# A long step says what it does, then its seconds: $(call timed,step,what it does,command) (no commas).
timed = @t0=$$(date +%s); echo "make: $(1): $(2) ..."; $(3); rc=$$?; \
	echo "make: $(1): $$( [ $$rc = 0 ] && echo done || echo "failed ($$rc)") in $$(( $$(date +%s) - t0 )) s"; exit $$rc

.PHONY: install install-demo bin bin-demo test test-unit demo demo-k8s demo-down conformance lab-pictures bench \
	lint dist image release-image upgrade-test events-test clean chaos

# Everything the tests, the Kubernetes lab, the benchmarks and the bundle need (Debian packages,
# Go builds: cnitool, etcd + Kubernetes + e2e + CoreDNS, the benchmarks' peers; the venvs).
install:
	bash .ci/install.sh

# Only what the embedded-registry lab runs (`make demo`): no Kubernetes, no benchmark peers, no
# dev/bench Python packages, no bundle venv, no container tooling (.ci/install.sh's switches).
install-demo:
	FERRY_KUBERNETES=0 FERRY_BENCH_PEERS=0 FERRY_DEV=0 FERRY_DIST=0 bash .ci/install.sh

# Lean launchers for the per-Pod executables (ferry, ferry-ipam) plus the Go reference
# plugins, in one CNI_PATH directory.
bin: install
	$(PY) -m cni.launcher $(BIN)

bin-demo: install-demo
	$(PY) -m cni.launcher $(BIN)

# The frozen bundle and Ferry's image are built first: the Kubernetes e2e (tests/e2e/kube) deploys
# the image with deploy/ferry.yaml, as users do.
test: bin image release-image
	bash .ci/test.sh

test-unit: install
	$(PY) -m pytest -q -m "not root" tests

# DEMO: more flags for ferry-lab demo, e.g. make demo DEMO="--mode hybrid --family 6".
# The picture of the lab (Graphviz) goes to build/demo.svg; the demo prints its path.
# It installs only what it runs (install-demo); DEMO=--kubernetes gets what demo-k8s gets.
DEMO ?=
demo: $(if $(findstring --kubernetes,$(DEMO)),bin image,bin-demo)
	$(VENV)/bin/ferry-lab demo --cni-bin $(BIN) --picture $(CURDIR)/build/demo.svg $(DEMO)

# The same on a real Kubernetes cluster (kube-apiserver, etcd, controller-manager, scheduler; a
# kubelet + containerd per Node; Ferry deployed by deploy/ferry.yaml); prints how to use kubectl.
demo-k8s: bin image
	$(VENV)/bin/ferry-lab demo --kubernetes --cni-bin $(BIN) --picture $(CURDIR)/build/demo.svg $(DEMO)

demo-down:
	$(VENV)/bin/ferry-lab down

# Kubernetes' own `[sig-network] ... [Conformance]` specs (e2e.test, v1.34.4) on the lab's cluster, one lab
# per traffic mode (every mode by default), kube-proxy in iptables mode; JUnit per mode and summary.md
# in build/conformance; non-zero exit when a spec failed. e2e.test, agnhost, ginkgo and CoreDNS are
# built once (cached). More flags: make conformance CONFORMANCE="--mode encap-vxlan --kube-proxy nftables";
# --suite netpol runs the NetworkPolicy specs ([sig-network] Netpol) instead, --suite all both;
# --suite cnp network-policy-api's ClusterNetworkPolicy conformance suite (its test binary, built once).
CONFORMANCE ?=
conformance: bin image
	bash tools/build-go-tools.sh kubernetes kube-e2e kube-e2e-images coredns network-policy-api
	bash tools/build-busybox.sh
	$(PY) -m lab.conformance $(CONFORMANCE)

# The pictures docs/ and README show, drawn by the command: the default demo and a hybrid demo.
lab-pictures: bin-demo
	@set -e; for lab in "pic-default:" "pic-hybrid:--mode hybrid"; do name=$${lab%%:*}; \
	  $(VENV)/bin/ferry-lab demo --name $$name --cni-bin $(BIN) --picture docs/lab-$${name#pic-}.svg $${lab#*:} \
	    >/dev/null || { $(VENV)/bin/ferry-lab down --name $$name; exit 1; }; \
	  $(VENV)/bin/ferry-lab down --name $$name >/dev/null; echo "docs/lab-$${name#pic-}.svg"; done

# Issue 10 at full size: 3 Nodes, 1,000 ADD/DEL from 16 workers, 100 SIGKILLs of plugin processes,
# route-sync killed 4 times, one ovs-vswitchd restart; prints the report (exit 1 on any leak).
chaos: bin
	$(PY) -m tests.e2e.chaos.run_chaos --ops 1000 --workers 16 --kills 100 --route-sync-restarts 4 --cni-bin $(BIN)

# Ferry's launchers and its frozen bundle against ovs-cni and the reference plugins (Debian's and
# upstream's); the Go peers are built (cached) by .ci/install.sh.
bench: bin dist
	$(PY) -m bench --cni-bin $(BIN) --docs docs

# The frozen onedir bundle (dist/ferry: ferry, ferry-ipam, ferry-route-sync, ferry-controller, one _internal);
# see build.spec.
dist: install
	$(call timed,dist,the frozen bundle dist/ferry (PyInstaller on build.spec),$(DIST_VENV)/bin/pyinstaller \
	  --noconfirm --log-level WARN --distpath $(CURDIR)/dist --workpath $(CURDIR)/build/pyi build.spec)

# Ferry's container image (Containerfile) from the bundle, on a Debian root file system made with
# mmdebstrap (cached); an OCI archive in build/image/ that `ctr images import` loads.
image: dist
	$(call timed,image,Ferry's image (tools/build-image.sh),bash tools/build-image.sh)

# The previous release's chart and image (deploy/previous-release names its tag and commit), built from its
# tag: the upgrade test installs it, upgrades to this tree and rolls back (make upgrade-test).
release-image: dist
	$(call timed,release-image,the previous release's image from its tag (tools/build-release-image.sh),bash tools/build-release-image.sh)

# Issue 42's events in the three modes (rollout.py's MODES; `make test` runs encap alone): each
# mode is a Kubernetes cluster per file. upgrade-test: the upgrade and rollback; events-test: those
# and route-sync, ovs-vswitchd and the openvswitch container killed, a new image rolled out, and
# WireGuard's key rotation and route-sync killed with the host's Open vSwitch too.
# FERRY_EVENT_DATAPATH=system runs them on the kernel datapath (a kernel with the openvswitch module).
upgrade-test: bin image release-image
	FERRY_EVENT_MODES=all $(PY) -m pytest -q -s -p no:cacheprovider tests/e2e/kube/test_kube_upgrade.py

events-test: bin image release-image
	FERRY_EVENT_MODES=all $(PY) -m pytest -q -s -p no:cacheprovider tests/e2e/kube/test_kube_ovs_container.py \
		tests/e2e/kube/test_kube_upgrade.py tests/e2e/kube/test_kube_wireguard.py

lint:
	$(VENV)/bin/ruff check cni routesync controller lab bench tests
	$(VENV)/bin/mypy cni routesync controller tests/controller tests/routesync/standins.py tests/routesync/test_standins.py

clean:
	rm -rf build dist .pytest_cache
