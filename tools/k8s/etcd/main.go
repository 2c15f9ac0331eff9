// Command etcd is upstream etcd's server, built from the published
// go.etcd.io/etcd/server/v3 module: the same entry point as etcd's own main.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
