"""``make conformance``: Kubernetes' own e2e specs (``e2e.test`` v1.34.4, by default
``[sig-network] ... [Conformance]``) on the lab's Kubernetes cluster, once per Ferry traffic mode.

``plan`` (the modes, the skip rules and which specs they select: pure), ``junit`` (reading the
JUnit e2e writes, the table: pure), ``run`` (per mode: lab up, e2e images imported, ginkgo in the
external host's network namespace, lab down) and ``cli`` (the ``conformance`` command).

A package of ``lab`` rather than of ``lab.kube``: it drives whole labs (``lab.api``), which
``lab.kube`` must never import."""
