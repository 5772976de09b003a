// cnitool, the CNI spec's own client, pinned: 1.3.0 has the STATUS and GC verbs and reads 1.1.0 results.
// Built by tools/build-go-tools.sh; go.sum pins every module's checksum.
module ferry.dev/tools/cnitool

go 1.24

require github.com/containernetworking/cni v1.3.0
