package taint

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// KeyAnnotation, on the controller's Lease, lists the taint keys that leaders of
// the Lease may have left on nodes, comma-separated (a taint key holds no comma):
// first the key of the leader that wrote it, then, while that leader lifts them,
// the keys of earlier leaders configured with another TAINT_KEY. A leader writes
// its own key there before it taints any node, so that the next leader, whatever
// its key, knows which taints to lift; it lifts the others' and then records its
// own alone (recordKey, liftEarlier). A Lease written by a version that did not
// record its key has none: nothing is lifted.
const KeyAnnotation = "cni.istio.io/taint-key"

// keyProblems says why key is not a taint key (none when it is): what the API
// server accepts as one, a qualified name.
func keyProblems(key string) []string { return validation.IsQualifiedName(key) }

// recordedKeys reads KeyAnnotation's value: the taint keys it lists, once each,
// and the elements that are not taint keys, which nothing acts on.
func recordedKeys(value string) (keys, refused []string) {
	if value == "" {
		return nil, nil
	}
	for _, k := range strings.Split(value, ",") {
		switch {
		case len(keyProblems(k)) > 0:
			refused = append(refused, k)
		case !slices.Contains(keys, k):
			keys = append(keys, k)
		}
	}
	return keys, refused
}

// withOwnKey is the annotation's value that lists the controller's key first, then
// the other keys of keys.
func (c *Controller) withOwnKey(keys []string) string {
	return strings.Join(append([]string{c.cfg.Key}, slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return k == c.cfg.Key })...), ",")
}

// recordKey, at the start of a term and before any node is tainted, makes the
// Lease's KeyAnnotation list the controller's key, followed by the keys other than
// it that the annotation listed (earlier: an earlier leader's taint key, still to
// be lifted). Should this term end before they are lifted, the next leader knows
// both. An element that is not a taint key is refused: logged once, acted on in no
// way, and not written back. A Lease without the annotation (a first install, or
// an earlier version that did not record its key) lists nothing earlier. held is
// false when the term ended first, or the Lease turned out to be another
// replica's.
func (c *Controller) recordKey(ctx context.Context) (earlier []string, held bool) {
	logged := false
	err := c.retry(ctx, "record the taint key on the lease", func(ctx context.Context) error {
		return c.bounded(ctx, func(ctx context.Context) error {
			return c.annotateLease(ctx, func(annotations map[string]string) bool {
				value, had := annotations[KeyAnnotation]
				keys, refused := recordedKeys(value)
				if len(refused) > 0 && !logged {
					logged = true
					c.log.Warn("the lease's "+KeyAnnotation+" annotation holds what is not a taint key: refused, no taint is lifted for it and it is not recorded again",
						"lease", c.cfg.AgentNamespace+"/"+c.cfg.LeaseName, "value", value, "refused", strings.Join(refused, ","))
				}
				earlier = slices.DeleteFunc(keys, func(k string) bool { return k == c.cfg.Key })
				want := c.withOwnKey(earlier)
				if had && value == want {
					return false
				}
				annotations[KeyAnnotation] = want
				return true
			})
		})
	})
	if err != nil {
		return nil, false
	}
	if len(earlier) > 0 {
		c.log.Info("the lease records earlier taint keys: lifting their taints from the nodes",
			"lease", c.cfg.AgentNamespace+"/"+c.cfg.LeaseName, "earlierKeys", strings.Join(earlier, ","), "taint", c.cfg.Key)
	}
	return earlier, true
}

// liftEarlier, beside the workers, removes every taint whose key is one of the
// earlier keys from the managed nodes (those of the node cache: matching
// TAINT_NODE_LABEL_SELECTOR), then has the Lease record the controller's key alone.
// Each pass goes once through the nodes that carry such a taint, one node at a
// time. It first reconciles the node (reconcile, as a worker would), so that a
// node that needs this controller's taint has it before the earlier one goes: the
// node is never left without either while its agent is not ready. It then removes
// the earlier keys' taints: a merge patch preconditioned on the cache's read of
// the node (a node changed since is read from the API server and patched again),
// each call bounded by APITimeout. Other taints, and this controller's own key's,
// are not touched. A pass in which a node failed is run again after a back-off
// (100 ms doubling to 30 s) and the Lease keeps the earlier keys meanwhile; the
// passes end with the term.
func (r *reconciler) liftEarlier(ctx context.Context) {
	_ = r.c.retry(ctx, "lift the taints of earlier taint keys", r.liftPass)
}

func (r *reconciler) liftPass(ctx context.Context) error {
	c, earlier := r.c, r.earlier
	api := c.client.CoreV1().Nodes()
	var failed []string
	var firstErr error
	carries := func(node *corev1.Node) bool {
		return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return slices.Contains(earlier, t.Key) })
	}
	for _, name := range r.nodes.ListKeys() {
		obj, exists, _ := r.nodes.GetByKey(name)
		if !exists || !carries(obj.(*corev1.Node)) {
			continue
		}
		var removed bool
		err := r.reconcile(ctx, name)
		if err == nil {
			// The node as the cache holds it now: if reconcile patched it and the
			// cache has not seen that yet, the patch below fails and reads it.
			obj, exists, _ = r.nodes.GetByKey(name)
			if exists {
				err = c.bounded(ctx, func(ctx context.Context) (err error) {
					removed, err = removeTaints(ctx, api, name, obj.(*corev1.Node), earlier)
					return err
				})
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			c.metrics.PatchFailures.Add(1)
			failed = append(failed, name)
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if removed {
			c.metrics.TaintsRemoved.Add(1)
			c.log.Info("node untainted: its taint has an earlier leader's key", "node", name, "earlierKeys", strings.Join(earlier, ","), "taint", c.cfg.Key)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d nodes keep a taint of %s (first %s): %w", len(failed), strings.Join(earlier, ","), failed[0], firstErr)
	}
	err := c.bounded(ctx, func(ctx context.Context) error {
		return c.annotateLease(ctx, func(annotations map[string]string) bool {
			value := annotations[KeyAnnotation]
			keys, _ := recordedKeys(value)
			want := c.withOwnKey(slices.DeleteFunc(keys, func(k string) bool { return slices.Contains(earlier, k) }))
			if value == want {
				return false
			}
			annotations[KeyAnnotation] = want
			return true
		})
	})
	if err != nil {
		return err
	}
	c.log.Info("earlier taint keys lifted from every managed node: the lease records this key alone",
		"lease", c.cfg.AgentNamespace+"/"+c.cfg.LeaseName, "earlierKeys", strings.Join(earlier, ","), "taint", c.cfg.Key)
	return nil
}

// errNotHolder: the Lease is another replica's (or nobody's), so this term is
// over, or ends at its next renewal.
var errNotHolder = errors.New("the lease is not this replica's")

// annotateLease lets edit change the Lease's annotations (a copy, empty when it
// has none; edit reports whether it changed them) and writes them, only while
// this replica holds the Lease (errNotHolder otherwise): an Update preconditioned
// on the read, which a renewal in between (a conflict) makes read again. The
// elector's next renewal, which writes the Lease as it last read it, then fails on
// the conflict in its turn and client-go reads the Lease and renews at once; its
// release reads the Lease first. An Update keeps the annotations: client-go's
// Lease lock replaces only the spec.
func (c *Controller) annotateLease(ctx context.Context, edit func(annotations map[string]string) bool) error {
	leases := c.client.CoordinationV1().Leases(c.cfg.AgentNamespace)
	for {
		l, err := leases.Get(ctx, c.cfg.LeaseName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read lease %s/%s: %w", c.cfg.AgentNamespace, c.cfg.LeaseName, err)
		}
		if h := l.Spec.HolderIdentity; h == nil || *h != c.cfg.Identity {
			return fmt.Errorf("lease %s/%s: %w", c.cfg.AgentNamespace, c.cfg.LeaseName, errNotHolder)
		}
		annotations := maps.Clone(l.Annotations)
		if annotations == nil {
			annotations = map[string]string{}
		}
		if !edit(annotations) {
			return nil
		}
		l.Annotations = annotations
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && ctx.Err() == nil {
			continue
		}
		if err != nil {
			return fmt.Errorf("annotate lease %s/%s: %w", c.cfg.AgentNamespace, c.cfg.LeaseName, err)
		}
		return nil
	}
}

// retry calls call until it succeeds, the term ends, or the Lease is found to be
// another replica's, waiting 100 ms doubling to 30 s between calls; a failure is
// logged once until its error changes, and its end is logged. The error is the
// last call's when it did not succeed.
func (c *Controller) retry(ctx context.Context, what string, call func(context.Context) error) error {
	const first, most = 100 * time.Millisecond, 30 * time.Second
	wait := first
	var last string
	for {
		err := call(ctx)
		switch {
		case err == nil:
			if last != "" {
				c.log.Info("able to " + what + " again")
			}
			return nil
		case ctx.Err() != nil:
			return err
		case errors.Is(err, errNotHolder):
			// Another replica took the Lease: this term ends at its next renewal.
			c.log.Info("cannot "+what+": the lease is another replica's now", "error", err)
			return err
		case err.Error() != last:
			last = err.Error()
			c.log.Warn("cannot "+what+"; retrying (logged again when the error changes)", "error", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, most)
	}
}
