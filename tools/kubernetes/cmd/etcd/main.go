// Command etcd is etcd's server (go.etcd.io/etcd/server/v3's etcdmain), the same entry point as
// upstream's etcd binary, built at the version go.mod pins.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
