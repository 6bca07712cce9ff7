package apibound

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestCallIsBoundedAndSaysSo: a call that never returns by itself is cut at the
// bound and its error names the bound; a call cut by its caller's context, or one
// that fails by itself, keeps its own error.
func TestCallIsBoundedAndSaysSo(t *testing.T) {
	hang := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	start := time.Now()
	err := Call(context.Background(), 50*time.Millisecond, hang)
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer from the API server within 50ms") || took > 2*time.Second {
		t.Errorf("a hung call: %v after %s, want cut at 50ms, saying so", err, took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Call(ctx, time.Minute, hang); !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "no answer") {
		t.Errorf("a call whose caller gave up: %v, want its own error", err)
	}
	own := errors.New("refused")
	if err := Call(context.Background(), time.Minute, func(context.Context) error { return own }); err != own {
		t.Errorf("a failed call: %v, want its error as is", err)
	}
}
