// Command debianlock writes hack/image/debian.lock: the Debian packages of the
// agent image (image.DebianRoots and what they depend on) for each architecture of
// its index, pinned by version and SHA-256, from the Packages indexes of the
// Debian archives this machine's apt uses (/etc/apt/sources.list*). Run it to move
// the image to newer packages (security updates):
//
//	go run ./hack/image/debianlock
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/istio-cni/istio-cni/hack/image"
)

func main() {
	out := flag.String("o", "hack/image/debian.lock", "the lock file to write")
	root := flag.String("root", "/", "the filesystem whose /etc/apt and /etc/os-release name the archives")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	_, distro, sources, err := image.AptSources(*root)
	if err == nil {
		err = image.WriteDebianLock(ctx, *out, distro, sources)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "debianlock:", err)
		os.Exit(1)
	}
	fmt.Println("wrote", *out)
}
