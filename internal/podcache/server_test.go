package podcache_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/informer"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/podcache"
	"github.com/istio-cni/istio-cni/test/harness/controlplane"
	"github.com/istio-cni/istio-cni/test/harness/poll"

	"github.com/istio-cni/istio-cni/test/harness/shortdir"
)

func pod(name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: map[string]string{"sidecar.istio.io/status": "{}"}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app"}, {Name: "istio-proxy", Image: "proxy"}}},
	}
}

// TestServesOnlyThisNodesPods: against a real API server, the cache answers for pods
// on its node (including ones created after it started), says "not found" for pods
// on other nodes, and its socket is root-only; with an informer of its own (New),
// and over the agent's shared informer of the node's pods (NewOnNodePods), which
// its owner runs, not the server.
func TestServesOnlyThisNodesPods(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	cases := []struct {
		name, node string
		// start builds the server and returns it with what the caller runs
		// besides it (nothing for a server with its own informer).
		start func(node string) (*podcache.Server, *informer.NodePods)
	}{{
		name: "own informer", node: "node-a",
		start: func(node string) (*podcache.Server, *informer.NodePods) {
			return podcache.New(cp.AdminClient(), node, nil), nil
		},
	}, {
		name: "shared informer run by its owner", node: "node-c",
		start: func(node string) (*podcache.Server, *informer.NodePods) {
			shared := informer.NewNodePods(cp.AdminClient().CoreV1(), node)
			return podcache.NewOnNodePods(cp.AdminClient(), shared, nil), shared
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			pods := cp.AdminClient().CoreV1().Pods("default")
			mine, err := pods.Create(ctx, pod("mine-"+tc.node, tc.node), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pods.Create(ctx, pod("theirs-"+tc.node, "not-"+tc.node), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(shortdir.New(t), podcache.SocketName)
			srv, shared := tc.start(tc.node)
			errc := make(chan error, 1)
			go func() { errc <- srv.Run(ctx, sock) }()
			if shared != nil {
				// Run started its namespaces' informer, which has listed; it must
				// not have started the shared one, which client-go runs only once.
				waitFor(t, func() bool { return srv.NamespacesSynced() })
				if shared.Informer.(interface{ HasStarted() bool }).HasStarted() || srv.Synced() {
					t.Fatal("the server's Run started the shared informer of the node's pods, which is its owner's to run")
				}
				go shared.Run(ctx)
			}
			waitFor(t, func() bool { return srv.Synced() })
			waitFor(t, func() bool { _, err := os.Stat(sock); return err == nil })
			if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("socket mode = %v (%v), want 0600", st.Mode().Perm(), err)
			}
			c := kube.NewAgentClient(sock, time.Second)
			got, err := c.GetPod(ctx, "default", mine.Name, "", 0)
			if err != nil {
				t.Fatalf("GetPod(%s): %v", mine.Name, err)
			}
			if got.Metadata.UID != string(mine.UID) || got.Spec.NodeName != tc.node || len(got.Spec.Containers) != 2 {
				t.Errorf("GetPod(%s) = %+v", mine.Name, got)
			}
			if _, err := c.GetPod(ctx, "default", "theirs-"+tc.node, "", 0); !errors.Is(err, kube.ErrNotFound) {
				t.Errorf("GetPod(a pod on another node) error = %v, want not found", err)
			}
			if _, err := pods.Create(ctx, pod("later-"+tc.node, tc.node), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool { _, err := c.GetPod(ctx, "default", "later-"+tc.node, "", 0); return err == nil })
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("Run: %v", err)
			}
			if _, err := os.Stat(sock); !os.IsNotExist(err) {
				t.Errorf("socket left behind after stop: %v", err)
			}
		})
	}
}

// TestServesNamespaceLabels: against a real API server, the cache answers for the
// cluster's namespaces with their labels (and nothing else of them), including a
// namespace created after it started and a label added later, and says "not found"
// for a namespace that does not exist.
func TestServesNamespaceLabels(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	namespaces := cp.AdminClient().CoreV1().Namespaces()
	create := func(name string, labels map[string]string) {
		t.Helper()
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{"note": "not served"}}}
		if _, err := namespaces.Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create("mesh", map[string]string{"istio.io/dataplane-mode": "ambient"})
	create("plain", nil)
	sock := filepath.Join(shortdir.New(t), podcache.SocketName)
	srv := podcache.New(cp.AdminClient(), "node-a", nil)
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx, sock) }()
	waitFor(t, func() bool { return srv.Synced() && srv.NamespacesSynced() })
	waitFor(t, func() bool { _, err := os.Stat(sock); return err == nil })
	c := kube.NewAgentClient(sock, time.Second)

	mode := func(name string) (string, error) {
		ns, err := c.GetNamespace(ctx, name)
		if err != nil {
			return "", err
		}
		if ns.Metadata.Name != name || len(ns.Metadata.Annotations) != 0 {
			t.Errorf("GetNamespace(%s) = %+v, want its name and labels only", name, ns.Metadata)
		}
		return ns.Metadata.Labels["istio.io/dataplane-mode"], nil
	}
	if got, err := mode("mesh"); err != nil || got != "ambient" {
		t.Errorf("mesh: dataplane-mode %q, %v; want ambient", got, err)
	}
	if got, err := mode("plain"); err != nil || got != "" {
		t.Errorf("plain: dataplane-mode %q, %v; want none", got, err)
	}
	if _, err := c.GetNamespace(ctx, "missing"); !errors.Is(err, kube.ErrNotFound) {
		t.Errorf("GetNamespace(missing) error = %v, want not found", err)
	}
	create("later", map[string]string{"istio.io/dataplane-mode": "ambient"})
	waitFor(t, func() bool { got, _ := mode("later"); return got == "ambient" })
	plain, err := namespaces.Get(ctx, "plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plain.Labels["istio.io/dataplane-mode"] = "ambient"
	if _, err := namespaces.Update(ctx, plain, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { got, _ := mode("plain"); return got == "ambient" })
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestServesPodsWithoutRightsToListNamespaces: an agent whose ClusterRole lets it
// watch pods but not namespaces (an older chart) still serves pods, and answers
// for namespaces with an error that is not "not found", so the plugin asks the API
// server.
func TestServesPodsWithoutRightsToListNamespaces(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if _, err := cp.AdminClient().CoreV1().Pods("default").Create(ctx, pod("mine", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client := cp.ServiceAccountClientForTest(t, "istio-system", "old-agent", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	})
	sock := filepath.Join(shortdir.New(t), podcache.SocketName)
	srv := podcache.New(client, "node-a", nil)
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx, sock) }()
	waitFor(t, func() bool { return srv.Synced() })
	waitFor(t, func() bool { _, err := os.Stat(sock); return err == nil })
	c := kube.NewAgentClient(sock, time.Second)
	if _, err := c.GetPod(ctx, "default", "mine", "", 0); err != nil {
		t.Errorf("GetPod(mine) without rights on namespaces: %v", err)
	}
	_, err := c.GetNamespace(ctx, "default")
	if err == nil || errors.Is(err, kube.ErrNotFound) || srv.NamespacesSynced() {
		t.Errorf("GetNamespace without rights to list them = %v (synced %v), want an error that is not \"not found\"", err, srv.NamespacesSynced())
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestAHeldRequestWaitsForThePodsEvent: against a real API server, a pod request
// with a wait is answered as soon as the pod's event reaches the cache (a pod
// created while the request is held; a cache that has not listed yet, whose owner
// starts it while the request is held); one for a uid the cache never gets is
// answered with what it holds once its wait ends, and counted, but one for the
// static pod a mirror pod mirrors is answered at once; a request without
// a wait is answered at once, as before; a bad wait is refused, naming it.
func TestAHeldRequestWaitsForThePodsEvent(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pods := cp.AdminClient().CoreV1().Pods("default")
	old, err := pods.Create(ctx, pod("old", "node-w"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shared := informer.NewNodePods(cp.AdminClient().CoreV1(), "node-w")
	srv := podcache.NewOnNodePods(cp.AdminClient(), shared, nil)
	sock := filepath.Join(shortdir.New(t), podcache.SocketName)
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx, sock) }()
	waitFor(t, func() bool { _, err := os.Stat(sock); return err == nil })
	c := kube.NewAgentClient(sock, time.Second)

	// Not listed yet: without a wait, an error at once; with one, the pod once
	// the informer's owner starts it.
	if _, err := c.GetPod(ctx, "default", "old", "", 0); err == nil {
		t.Fatal("GetPod before the cache listed: no error")
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		shared.Run(ctx)
	}()
	start := time.Now()
	got, err := c.GetPod(ctx, "default", "old", string(old.UID), podcache.MaxWait)
	if took := time.Since(start); err != nil || got.Metadata.UID != string(old.UID) || took >= podcache.MaxWait {
		t.Fatalf("GetPod held while the cache lists: %v, %v after %s; want the pod before the wait ends", got, err, took)
	}

	// Created while held: answered on its event, well before the wait ends.
	if _, err := c.GetPod(ctx, "default", "new", "", 0); !errors.Is(err, kube.ErrNotFound) {
		t.Fatalf("GetPod(new) without a wait, before it exists: %v, want not found", err)
	}
	created := make(chan error, 1)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, err := pods.Create(ctx, pod("new", "node-w"), metav1.CreateOptions{})
		created <- err
	}()
	start = time.Now()
	got, err = c.GetPod(ctx, "default", "new", "", podcache.MaxWait)
	took := time.Since(start)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if err != nil || got.Metadata.Name != "new" || took < 50*time.Millisecond || took >= podcache.MaxWait {
		t.Fatalf("GetPod(new) held while it is created: %v, %v after %s; want the pod after its creation and before the wait ends", got, err, took)
	}
	if n := srv.Waits.Found.Load(); n != 2 {
		t.Errorf("Waits.Found = %d, want 2", n)
	}

	// Another uid than the one held: the wait runs out, and the held pod is the
	// answer (the plugin then asks the API server).
	start = time.Now()
	got, err = c.GetPod(ctx, "default", "old", "a-successor", 300*time.Millisecond)
	if took := time.Since(start); err != nil || got.Metadata.UID != string(old.UID) || took < 300*time.Millisecond {
		t.Errorf("GetPod(old) for another uid: %v, %v after %s; want the held pod after the 300ms wait", got, err, took)
	}
	if n := srv.Waits.TimedOut.Load(); n != 1 {
		t.Errorf("Waits.TimedOut = %d, want 1", n)
	}

	// A static pod's mirror is held for the static pod's uid (in its mirror
	// annotation; the API server gave the mirror another): answered at once.
	mirror := pod("static-node-w", "node-w")
	mirror.Annotations = map[string]string{kube.MirrorAnnotation: "static-uid"}
	if _, err := pods.Create(ctx, mirror, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := c.GetPod(ctx, "default", "static-node-w", "", 0); return err == nil })
	start = time.Now()
	got, err = c.GetPod(ctx, "default", "static-node-w", "static-uid", 300*time.Millisecond)
	if took := time.Since(start); err != nil || got.Metadata.Name != "static-node-w" || took >= 300*time.Millisecond {
		t.Errorf("GetPod(static-node-w) for the static pod's uid: %v, %v after %s; want the mirror before the wait ends", got, err, took)
	}
	if n := srv.Waits.TimedOut.Load(); n != 1 {
		t.Errorf("Waits.TimedOut = %d after the mirror's request, want 1 (it does not wait)", n)
	}

	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Get("http://agent/v1/pods/default/old?wait=10&uid=" + strings.Repeat("u", podcache.MaxUIDBytes+1))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "uid: 129 bytes") {
		t.Errorf("a 129-byte uid: %d %q, want 400 naming the uid and its length", resp.StatusCode, body)
	}
	for _, wait := range []string{"abc", "-1", "1.5", "1001"} {
		resp, err := hc.Get("http://agent/v1/pods/default/old?wait=" + wait)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `wait="`+wait+`"`) {
			t.Errorf("wait=%s: %d %q, want 400 naming the value", wait, resp.StatusCode, body)
		}
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "the condition holds", cond)
}

// TestAStoppingServerLeavesTheNextServersSocketAndFiles: during a rolling update two
// agents share the run dir (both mount it from the host), and the new agent's pod
// cache starts while the old one's still runs: the new one takes over pods.sock and
// pods/, and the plugin reads the files once the new one keeps them (its lock).
// When the old one then stops, the new one's socket and pod files stay, still
// kept, and it keeps writing files for new pods; once it stops too, no plugin
// reads a file.
func TestAStoppingServerLeavesTheNextServersSocketAndFiles(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	client := cp.AdminClient()
	pods := client.CoreV1().Pods("default")
	if _, err := pods.Create(t.Context(), pod("handover-0", "node-h"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(shortdir.New(t), podcache.SocketName)
	filesDir := filepath.Join(filepath.Dir(sock), kube.AgentPodFilesDir)
	start := func(ctx context.Context) chan error {
		shared := informer.NewNodePods(client.CoreV1(), "node-h")
		srv := podcache.NewOnNodePods(client, shared, nil)
		errc := make(chan error, 1)
		go func() { errc <- srv.Run(ctx, sock) }()
		go shared.Run(ctx)
		waitFor(t, func() bool { return srv.Synced() })
		return errc
	}
	c := kube.NewAgentClient(sock, time.Second)
	answers := func() bool { _, err := c.GetPod(t.Context(), "default", "handover-0", "", 0); return err == nil }

	oldCtx, stopOld := context.WithCancel(t.Context())
	defer stopOld()
	oldDone := start(oldCtx)
	waitFor(t, answers)

	newCtx, stopNew := context.WithCancel(t.Context())
	defer stopNew()
	newDone := start(newCtx)
	read := func(name string) error { _, err := kube.ReadAgentPodFile(filesDir, "default", name); return err }
	waitFor(t, func() bool { return read("handover-0") == nil })
	waitFor(t, answers)

	stopOld() // the old agent's SIGTERM ends its controllers
	if err := <-oldDone; err != nil {
		t.Fatalf("the old server's Run: %v", err)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("the new server's socket is gone after the old server stopped: %v", err)
	} else if !answers() {
		t.Errorf("the new server does not answer after the old server stopped")
	}
	if err := read("handover-0"); err != nil {
		t.Errorf("the new server's pod file is gone, or no longer kept, after the old server stopped: %v", err)
	}
	if _, err := pods.Create(t.Context(), pod("handover-1", "node-h"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return read("handover-1") == nil })

	stopNew()
	if err := <-newDone; err != nil {
		t.Errorf("the new server's Run: %v", err)
	}
	for _, p := range []string{sock, filesDir} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind once the last server stopped: %v", p, err)
		}
	}
	if err := read("handover-1"); !errors.Is(err, kube.ErrPodFilesNotKept) {
		t.Errorf("a pod file once the last server stopped: %v, want %v", err, kube.ErrPodFilesNotKept)
	}
}

// TestServingOnlyWhileTheSocketServes: Serving (the agent's "pod cache synced"
// metric and log) is true only while Run serves on its socket with the pods
// listed. A Run that could not take its socket leaves the informer running and
// Synced true, and the plugin can read nothing from the agent: the agent's
// metric once said "synced" then, and a test asked a socket that was not there.
func TestServingOnlyWhileTheSocketServes(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sock := filepath.Join(shortdir.New(t), podcache.SocketName)
	if err := os.Mkdir(sock, 0o700); err != nil { // in the way: Run fails
		t.Fatal(err)
	}
	srv := podcache.New(cp.AdminClient(), "node-a", nil)
	if err := srv.Run(ctx, sock); err == nil {
		t.Fatal("Run with a directory at its socket's path: no error")
	}
	waitFor(t, func() bool { return srv.Synced() })
	if srv.Serving() {
		t.Error("Serving() = true after a Run that could not take its socket")
	}

	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx, sock) }()
	waitFor(t, func() bool { return srv.Serving() })
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("Serving() = true and the socket is not there: %v", err)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run: %v", err)
	}
	if srv.Serving() {
		t.Error("Serving() = true after Run returned")
	}
}
