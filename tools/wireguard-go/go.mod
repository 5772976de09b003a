// wireguard-go, the userspace WireGuard (route-sync runs it where the kernel has no WireGuard module,
// trafficEncryptionMode: wireguard), pinned: the module has no tagged release, so the pseudo-version
// the Go module proxy served as @latest. Built static (no cgo): it runs on the host, in the lab's
// Nodes and in Ferry's image. Built by tools/build-go-tools.sh; go.sum pins every module's checksum.
module ferry.dev/tools/wireguard-go

go 1.24

require golang.zx2c4.com/wireguard v0.0.0-20260522210424-ecfc5a8d5446

require (
	golang.org/x/crypto v0.37.0 // indirect
	golang.org/x/net v0.39.0 // indirect
	golang.org/x/sys v0.32.0 // indirect
	golang.zx2c4.com/wintun v0.0.0-20230126152724-0fa3db229ce2 // indirect
)
