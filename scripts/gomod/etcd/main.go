// Command etcd is upstream etcd's server, built from its Go module (go install cannot build it: its go.mod has
// replace directives). Nothing here but the call upstream's own main makes.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
