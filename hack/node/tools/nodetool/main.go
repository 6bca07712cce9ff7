// Command nodetool holds the local node's helpers that need modules the main module
// does not carry: a tiny CRI client (k8s.io/cri-api). test/harness/node builds and
// runs it.
//
//	nodetool pods  -endpoint unix:///path/containerd.sock
//	nodetool sweep -endpoint unix:///path/containerd.sock
//	nodetool status -endpoint unix:///path/containerd.sock
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "pods", "sweep", "status":
		err = criCmd(os.Args[1], os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nodetool %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: nodetool pods|sweep|status [flags]")
	os.Exit(2)
}

func criCmd(cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	endpoint := fs.String("endpoint", "", "CRI endpoint, unix:///path/to.sock")
	timeout := fs.Duration("timeout", 60*time.Second, "overall timeout")
	fs.Parse(args)
	if *endpoint == "" {
		return fmt.Errorf("-endpoint is required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	rt, closeConn, err := dial(*endpoint)
	if err != nil {
		return err
	}
	defer closeConn()
	switch cmd {
	case "pods":
		return listPods(ctx, rt)
	case "status":
		return status(ctx, rt)
	}
	return sweep(ctx, rt)
}
