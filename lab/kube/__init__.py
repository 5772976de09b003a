"""ferry-lab's real Kubernetes cluster (``ferry-lab up --kubernetes``): etcd, kube-apiserver,
kube-controller-manager and kube-scheduler on the lab's external host, containerd and a kubelet on
every Node, Ferry deployed by its own DaemonSet (``deploy/ferry.yaml``).

``spec`` (the topology's ``kubernetes`` block) and ``plan`` (argv, configs, mounts: pure) are read
without root; ``cluster`` applies them; ``pki``, ``ociimage`` and ``manifests`` are its parts.
May import ``lab.topology``, ``lab.layout``, ``lab.manifest``, ``lab.sh`` and ``lab.tools``; never
``lab.api`` or ``lab.build`` (they import this package)."""
