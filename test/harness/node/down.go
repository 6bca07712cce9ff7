package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Down takes the node down in the order that lets each component undo its own work
// (see the package doc), restores what Up changed on the host, removes the state
// dir, and then checks that nothing is left: leftovers are an error. Safe to call
// more than once.
func (n *Node) Down() error {
	n.downOnce.Do(func() {
		began := time.Now()
		n.downErr = n.down()
		n.downDur = time.Since(began)
		n.step("down in %s", since(began))
	})
	return n.downErr
}

func (n *Node) down() error {
	var errs errList
	// Controllers first: nothing may recreate the pods deleted next.
	errs.add(n.kcm.Stop(5 * time.Second))
	errs.add(n.scheduler.Stop(5 * time.Second))
	if n.kubelet != nil && n.kubelet.Running() && n.client != nil {
		t := time.Now()
		count, err := n.deletePods(30 * time.Second)
		errs.add(err)
		n.step("%d pods deleted through kubelet (%s)", count, since(t))
	}
	errs.add(n.kubelet.Stop(10 * time.Second))
	errs.add(n.kubeProxy.Stop(5 * time.Second)) // its tables go with the host's restore
	if n.containerd != nil && n.containerd.Running() {
		// Whatever kubelet did not finish: stopping a sandbox runs its CNI DEL and
		// removes its network namespace.
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		out, err := n.nodetool(ctx, "sweep", "-endpoint", "unix://"+n.l.containerdSocket())
		cancel()
		if err != nil {
			errs.add(fmt.Errorf("node: remove leftover sandboxes: %w", err))
		} else if out != "0\n" {
			n.step("removed %s stopped sandboxes through CRI", out[:len(out)-1])
		}
	}
	errs.add(n.containerd.Stop(10 * time.Second))
	// Shims outlive containerd by design; after the sweep they have nothing to
	// serve, but a failed sweep must not leave them (or their containers) running.
	if pids := processesUsing(n.l.state); len(pids) > 0 {
		killAll(pids)
		time.Sleep(200 * time.Millisecond)
	}
	errs.add(killContainers(n.l.runcRoot()))
	errs.add(removeCNICache(n.l.runcRoot()))
	if n.cp != nil {
		errs.add(n.cp.Stop())
	}
	if n.launcher != nil {
		n.launcher.Close()
	}
	errs.add(unmountUnder(n.l.state))
	if n.host != nil {
		undone, err := n.host.restore()
		errs.add(err)
		if len(undone) > 0 {
			n.step("host restored: %s", strings.Join(undone, ", "))
		}
	}
	if err := os.RemoveAll(n.l.state); err != nil {
		errs.add(fmt.Errorf("node: remove %s: %w", n.l.state, err))
	}
	if left := Leftovers(n.l.state, n.opts.PodCIDR); len(left) > 0 {
		errs.add(fmt.Errorf("node: left on the host after down: %v", left))
	}
	return errors.Join(errs...)
}

// deletePods deletes every pod with a short grace period and waits until the API has
// none: kubelet removes a pod's object only after its sandbox is stopped, which is
// when the CNI DEL runs.
func (n *Node) deletePods(timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pods, err := n.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("node: list pods: %w", err)
	}
	grace := int64(1)
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		err := n.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
		if err != nil && !isNotFound(err) {
			return 0, fmt.Errorf("node: delete pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	for {
		left, err := n.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err == nil && len(left.Items) == 0 {
			return len(pods.Items), nil
		}
		select {
		case <-ctx.Done():
			names := []string{}
			if left != nil {
				for _, p := range left.Items {
					names = append(names, p.Namespace+"/"+p.Name)
				}
			}
			return len(pods.Items), fmt.Errorf("node: pods still present after %s: %v", timeout, names)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// errList collects the errors of steps that all run whatever the others did.
type errList []error

// add keeps err unless it is nil.
func (l *errList) add(err error) {
	if err != nil {
		*l = append(*l, err)
	}
}
