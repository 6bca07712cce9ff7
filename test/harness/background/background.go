// Package background runs a test's long-lived piece of the product (a
// controller's Run) on its own goroutine, and stops it before the test ends.
package background

import (
	"context"
	"sync"
	"testing"
)

// Run calls run on a goroutine with a context that ends when the returned stop
// is called, or when t ends. stop waits for run to return; calling it again does
// nothing.
func Run(t testing.TB, run func(ctx context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("stopped before the test stopped it: %v", err)
		}
	}()
	stop = sync.OnceFunc(func() {
		cancel()
		<-done
	})
	t.Cleanup(stop)
	return stop
}
