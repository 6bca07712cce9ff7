package background

import (
	"context"
	"sync/atomic"
	"testing"
)

func TestRunStopsOnceAndWaitsForRunToReturn(t *testing.T) {
	var returned atomic.Int32
	stop := Run(t, func(ctx context.Context) error {
		<-ctx.Done()
		returned.Add(1)
		return ctx.Err()
	})
	if returned.Load() != 0 {
		t.Fatal("run returned before stop")
	}
	stop()
	if returned.Load() != 1 {
		t.Fatal("stop returned before run did")
	}
	stop() // a second stop (and t's cleanup) neither blocks nor runs anything again
	if returned.Load() != 1 {
		t.Errorf("run returned %d times", returned.Load())
	}
}
