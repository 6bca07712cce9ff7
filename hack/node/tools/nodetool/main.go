// Command nodetool holds the local node's helpers that need modules the main module
// does not carry: an OCI image builder (go-containerregistry) and a tiny CRI client
// (k8s.io/cri-api). test/harness/node builds and runs it.
//
//	nodetool image -name REF -out FILE [-file /in/image=/on/host]... [-- ENTRYPOINT...]
//	nodetool pods  -endpoint unix:///path/containerd.sock
//	nodetool sweep -endpoint unix:///path/containerd.sock
//	nodetool status -endpoint unix:///path/containerd.sock
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "image":
		err = imageCmd(os.Args[2:])
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
	fmt.Fprintln(os.Stderr, "usage: nodetool image|pods|sweep|status [flags]")
	os.Exit(2)
}

// fileFlags collects repeated -file /in/image=/on/host flags.
type fileFlags map[string]string

func (f fileFlags) String() string { return fmt.Sprint(map[string]string(f)) }

func (f fileFlags) Set(v string) error {
	dst, src, ok := strings.Cut(v, "=")
	if !ok || !strings.HasPrefix(dst, "/") || src == "" {
		return fmt.Errorf("want /path/in/image=/path/on/host, got %q", v)
	}
	f[dst] = src
	return nil
}

func imageCmd(args []string) error {
	fs := flag.NewFlagSet("image", flag.ExitOnError)
	name := fs.String("name", "", "image reference, e.g. istio-cni.local/pause:v1")
	out := fs.String("out", "", "tarball to write")
	files := fileFlags{}
	fs.Var(files, "file", "/path/in/image=/path/on/host (repeatable)")
	fs.Parse(args)
	if *name == "" || *out == "" || len(files) == 0 {
		return fmt.Errorf("-name, -out and at least one -file are required")
	}
	return buildImage(*name, *out, files, fs.Args())
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
	switch cmd {
	case "pods":
		return listPods(ctx, *endpoint)
	case "status":
		return status(ctx, *endpoint)
	}
	return sweep(ctx, *endpoint)
}
