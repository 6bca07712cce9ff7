// Command testserver is the workload of the node tests: an HTTP server that answers
// every request with "pod NAME" (NAME from $POD_NAME), built static so its image
// holds only this binary.
package main

import (
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	addr := ":8080"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	name := os.Getenv("POD_NAME")
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "pod %s\n", name)
	})
	go func() {
		// PID 1 gets no default signal handling: exit on SIGTERM ourselves so a
		// deletion does not wait for the grace period.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		<-sigs
		os.Exit(0)
	}()
	if err := http.ListenAndServe(addr, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
