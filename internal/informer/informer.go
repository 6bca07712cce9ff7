// Package informer holds what the agent's cluster controllers (taint, NAD, repair,
// the pod cache) share around client-go: an informer over one list-and-watch, limited
// by a selector; the one informer of the node's pods that the pod cache and repair
// read together; and the worker loop that drains a rate-limited queue of keys.
package informer

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Selector limits what an informer lists and watches; empty fields select all.
type Selector struct {
	Label, Field string
}

// New is an informer over list and watch, limited by sel, indexed by namespace.
func New[L runtime.Object](obj runtime.Object, sel Selector,
	list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) cache.SharedIndexInformer {
	limit := func(o *metav1.ListOptions) {
		o.LabelSelector, o.FieldSelector = sel.Label, sel.Field
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			limit(&o)
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			limit(&o)
			return watchFn(ctx, o)
		},
	}
	return cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// Work runs workers goroutines that take keys from queue and handle them until ctx
// ends; then it shuts the queue down and waits for them. A key whose handling fails
// goes back with the queue's backoff, after failed is told; repeated says the key's
// previous attempt failed with the same error, so that a failure that lasts is
// logged once, not at every retry (the back-off's cap still means a hundred lines an
// hour for each node or namespace that keeps failing). failed is told once more,
// with a nil err, when a key that failed is handled: the failure's end.
func Work(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string], workers int,
	handle func(ctx context.Context, key string) error, failed func(key string, err error, repeated bool),
) {
	var mu sync.Mutex
	lastErr := map[string]string{} // per key failing now, its last error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				key, quit := queue.Get()
				if quit {
					return
				}
				if err := handle(ctx, key); err != nil {
					mu.Lock()
					last, failing := lastErr[key]
					lastErr[key] = err.Error()
					mu.Unlock()
					failed(key, err, failing && last == err.Error())
					queue.AddRateLimited(key)
				} else {
					mu.Lock()
					_, failing := lastErr[key]
					delete(lastErr, key)
					mu.Unlock()
					if failing {
						failed(key, nil, false)
					}
					queue.Forget(key)
				}
				queue.Done(key)
			}
		})
	}
	<-ctx.Done()
	queue.ShutDown()
	wg.Wait()
}
