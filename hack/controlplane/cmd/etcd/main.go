// Command etcd is etcd's own server entrypoint, built from the Go module so tests need no download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
