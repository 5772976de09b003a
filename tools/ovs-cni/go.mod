// ovs-cni's plugin (type "ovs"), an OVS-based Go CNI plugin, pinned: bench/bench_cni.py runs it
// on the same netdev bridge as Ferry. v0.39.0 is the version the Go module proxy serves. Its
// own go.mod replaces the k8s.io modules; a replace applies only in the main module, so the
// same replaces are repeated here. Built by tools/build-go-tools.sh; go.sum pins every module.
module ferry.dev/tools/ovs-cni

go 1.24

require github.com/k8snetworkplumbingwg/ovs-cni v0.39.0

require (
	dario.cat/mergo v1.0.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cenkalti/backoff/v4 v4.2.1 // indirect
	github.com/cenkalti/hub v1.0.1 // indirect
	github.com/cenkalti/rpc2 v0.0.0-20210604223624-c1acbc6ec984 // indirect
	github.com/cespare/xxhash/v2 v2.1.2 // indirect
	github.com/containernetworking/cni v1.2.3 // indirect
	github.com/containernetworking/plugins v1.5.1 // indirect
	github.com/coreos/go-iptables v0.7.0 // indirect
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/go-logr/logr v1.4.2 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/j-keck/arping v1.0.3 // indirect
	github.com/k8snetworkplumbingwg/sriovnet v1.2.0 // indirect
	github.com/matttproud/golang_protobuf_extensions v1.0.1 // indirect
	github.com/ovn-org/libovsdb v0.7.0 // indirect
	github.com/pmezard/go-difflib v1.0.1-0.20181226105442-5d4384ee4fb2 // indirect
	github.com/prometheus/client_golang v1.12.1 // indirect
	github.com/prometheus/client_model v0.2.0 // indirect
	github.com/prometheus/common v0.32.1 // indirect
	github.com/prometheus/procfs v0.7.3 // indirect
	github.com/safchain/ethtool v0.4.0 // indirect
	github.com/spf13/afero v1.9.4 // indirect
	github.com/stretchr/testify v1.9.0 // indirect
	github.com/vishvananda/netlink v1.2.1-beta.2 // indirect
	github.com/vishvananda/netns v0.0.4 // indirect
	golang.org/x/sys v0.31.0 // indirect
	golang.org/x/text v0.23.0 // indirect
	google.golang.org/protobuf v1.35.1 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)

replace (
	k8s.io/api => k8s.io/api v0.32.0
	k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.32.0
	k8s.io/apimachinery => k8s.io/apimachinery v0.32.0
	k8s.io/apiserver => k8s.io/apiserver v0.32.0
	k8s.io/cli-runtime => k8s.io/cli-runtime v0.32.0
	k8s.io/client-go => k8s.io/client-go v0.32.0
	k8s.io/cloud-provider => k8s.io/cloud-provider v0.32.0
	k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.32.0
	k8s.io/code-generator => k8s.io/code-generator v0.32.0
	k8s.io/component-base => k8s.io/component-base v0.32.0
	k8s.io/cri-api => k8s.io/cri-api v0.32.0
	k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.32.0
	k8s.io/kube-aggregator => k8s.io/kube-aggregator v0.32.0
	k8s.io/kube-controller-manager => k8s.io/kube-controller-manager v0.32.0
	k8s.io/kube-proxy => k8s.io/kube-proxy v0.32.0
	k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.32.0
	k8s.io/kubectl => k8s.io/kubectl v0.32.0
	k8s.io/kubelet => k8s.io/kubelet v0.32.0
	k8s.io/legacy-cloud-providers => k8s.io/legacy-cloud-providers v0.30.4
	k8s.io/metrics => k8s.io/metrics v0.32.0
	k8s.io/sample-apiserver => k8s.io/sample-apiserver v0.32.0
)
