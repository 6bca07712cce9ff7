// Package apibound bounds one call of a controller to the API server. The agent's
// API client has no overall timeout (client-go would apply one to a whole watch
// stream), so each write of the repair, taint and NetworkAttachmentDefinition
// workers, and the reads before them, go through Call: a call the API server does
// not answer fails after the bound, naming it, and is retried as any failed call.
package apibound

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Call runs call with ctx bounded by timeout. When the bound (not ctx) cut the
// call, its error says so: "no answer from the API server within 30s: ...".
func Call(ctx context.Context, timeout time.Duration, call func(context.Context) error) error {
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := call(callCtx)
	if err != nil && ctx.Err() == nil && errors.Is(callCtx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("no answer from the API server within %s: %w", timeout, err)
	}
	return err
}
