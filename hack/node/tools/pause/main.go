// Command pause is the sandbox ("pause") container of the local node: it holds the
// pod's namespaces open, reaps orphaned children (it is PID 1 when the pod shares its
// PID namespace), and exits on SIGINT or SIGTERM. It is built static (CGO_ENABLED=0)
// so the image needs no other file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
