package podcache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/istio-cni/istio-cni/internal/informer"
	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/internal/ownfile"
	"github.com/istio-cni/istio-cni/internal/unixsock"
)

// SocketName is the socket's name in the agent's run directory.
const SocketName = "pods.sock"

// Server answers GET /v1/pods/NAMESPACE/NAME from an informer of one node's pods,
// and GET /v1/namespaces/NAME from an informer of the cluster's namespaces (their
// labels decide whether a pod is an ambient pod; they are few and change rarely).
type Server struct {
	informer cache.SharedIndexInformer
	// ownPods: Run runs the pods' informer. False when it is shared (NewOnNodePods):
	// its owner runs it.
	ownPods bool
	// namespaces is separate from the pods' informer: an agent whose ClusterRole
	// cannot list namespaces still serves pods (the plugin then GETs namespaces).
	namespaces cache.SharedIndexInformer
	// podEvents wakes the requests held for a pod (the wait parameter) at each
	// add or update of a pod.
	podEvents *broadcast
	// Waits counts the pod requests that waited.
	Waits WaitCounts
	log   *slog.Logger
	// informers starts the informers once: a Run that failed is run again, and
	// the informers the first one started go on.
	informers sync.Once
	// serving is true while Run serves on its socket.
	serving atomic.Bool
	// socketGone wakes Run to look whether its socket's path is gone (SocketGone).
	socketGone chan struct{}
}

// Client is the part of the API the server uses. A kubernetes.Interface clientset
// satisfies it; the agent passes a client of the core group alone, so that its
// binary does not link a client for every API group.
type Client interface {
	CoreV1() corev1client.CoreV1Interface
}

// New builds the server with its own informer of nodeName's pods. Run starts it.
func New(client Client, nodeName string, log *slog.Logger) *Server {
	s := NewOnNodePods(client, informer.NewNodePods(client.CoreV1(), nodeName), log)
	s.ownPods = true
	return s
}

// NewOnNodePods builds the server over pods, the informer of its node's pods that it
// shares with other parts of the agent (the repair controller): Run does not run it,
// its owner does; Synced waits for it as for an own one.
func NewOnNodePods(client Client, pods *informer.NodePods, log *slog.Logger) *Server {
	namespaces := client.CoreV1().Namespaces()
	nsInf := cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return namespaces.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return namespaces.Watch(ctx, o)
		},
	}, &corev1.Namespace{}, 0, cache.Indexers{})
	_ = nsInf.SetTransform(trimNamespace)
	return &Server{informer: pods.Informer, namespaces: nsInf, podEvents: newBroadcast(), log: log,
		socketGone: make(chan struct{}, 1)}
}

// Synced reports whether the informer has listed the node's pods once.
func (s *Server) Synced() bool { return s.informer.HasSynced() }

// NamespacesSynced reports whether the informer has listed the namespaces once.
func (s *Server) NamespacesSynced() bool { return s.namespaces.HasSynced() }

// Serving reports whether the plugin can read pods from the server: its socket is
// in place and the pods' informer has listed once. Synced alone may be true while
// Run has failed and waits to be run again (the informer goes on).
func (s *Server) Serving() bool { return s.serving.Load() && s.Synced() }

// Run serves on the unix socket at path until ctx ends, and keeps the pod files
// beside it (kube.AgentPodFilesDir) until then, holding their lock
// (kube.AgentPodFilesLock) from the moment every pod listed is written. The socket and the files are
// readable only by root (the plugin runs as root; pod data must not leak to other
// users). A connection is bounded by ReadTimeout, WriteTimeout and IdleTimeout.
//
// A socket and files already there are a previous agent's, and Run replaces them,
// also while that agent still runs (a rolling update: both mount the run directory
// from the host). Stopping, it removes the socket and the files' directory only if
// they are still the ones it made: those of an agent that took over stay. A Run
// that failed may be called again with the same ctx: the informers the first
// started go on.
func (s *Server) Run(ctx context.Context, path string) error {
	files, err := openPodFiles(filesDir(path), s.logger())
	if err != nil {
		return fmt.Errorf("pod cache: %w", err)
	}
	reg, err := s.informer.AddEventHandler(files.handler())
	if err != nil {
		files.close()
		return fmt.Errorf("pod cache: %w", err)
	}
	wake, err := s.informer.AddEventHandler(s.podEvents.handler())
	if err != nil {
		_ = s.informer.RemoveEventHandler(reg)
		files.close()
		return fmt.Errorf("pod cache: %w", err)
	}
	// The plugin reads the files once every pod the watch listed is written, and
	// for as long as this Run writes them (kube.AgentPodFilesLock). Looked at as
	// often as a held request looks: until then every ADD asks the socket.
	keeping, stopKeeping := context.WithCancel(ctx)
	go func() {
		if wait.PollUntilContextCancel(keeping, notSyncedPoll, true, func(context.Context) (bool, error) {
			return reg.HasSynced(), nil
		}) == nil {
			files.markSynced()
		}
	}()
	defer func() {
		stopKeeping()
		_ = s.informer.RemoveEventHandler(wake)
		_ = s.informer.RemoveEventHandler(reg)
		files.close()
	}()
	s.informers.Do(func() {
		if s.ownPods {
			go s.informer.Run(ctx.Done())
		}
		go s.namespaces.Run(ctx.Done())
	})
	// A socket there is a previous agent's: a stopped one's, or, during a rolling
	// update, the old agent's still serving, which this one takes over in one step.
	ln, err := unixsock.Listen("unix", path, 0o600)
	if err != nil {
		return fmt.Errorf("pod cache: %w", err)
	}
	// Removed below only if still this server's: the next agent may have taken the
	// path over (ownfile).
	own, _ := os.Lstat(path)
	s.serving.Store(true)
	defer func() {
		s.serving.Store(false)
		ln.Close()
		if err := ownfile.Remove(path, own); err != nil {
			s.logger().Warn("pod cache: remove socket", "error", err)
		}
	}()
	srv := &http.Server{Handler: s, ReadHeaderTimeout: time.Second, ReadTimeout: ReadTimeout,
		WriteTimeout: WriteTimeout, IdleTimeout: IdleTimeout, ErrorLog: slog.NewLogLogger(s.logger().Handler(), slog.LevelError)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	for {
		select {
		case <-ctx.Done():
			srv.Close()
			<-served
			return nil
		case err := <-served:
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("pod cache: %w", err)
			}
			return nil
		case <-s.socketGone:
			if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
				continue
			}
			srv.Close()
			<-served
			return fmt.Errorf("pod cache: its socket %s is gone (another agent on this node that had taken it over removed it when it stopped): "+
				"no plugin can reach this one; making the socket and the pod files again", path)
		}
	}
}

// SocketGone tells a running Run that its socket's path may be gone: another agent
// sharing the run directory (a second DaemonSet on the node) took the socket over
// and, stopping, removed it as its own. Run then returns an error when the path is
// indeed gone, so that it is run again (the agent's keepRunning), which makes the
// socket and the pod files anew; it serves on otherwise (the path was taken over).
func (s *Server) SocketGone() {
	select {
	case s.socketGone <- struct{}{}:
	default:
	}
}

// ServeHTTP implements GET /v1/pods/NAMESPACE/NAME and GET /v1/namespaces/NAME.
// Until an informer has listed once it answers 503, and 404 for what it does not
// hold: the plugin then asks the API server.
//
// A pod request may carry wait=MILLISECONDS (at most MaxWait) and uid=UID: when
// the cache does not hold that pod (not listed yet, not seen yet, or only a
// predecessor of another uid), the request is held until the pod's event comes or
// the wait ends, whichever is first. The runtime sets a pod's sandbox up only once
// the kubelet's watch has seen the pod, and this agent's watch sees the same event;
// on a node starting many pods at once the agent may be that event behind, and
// waiting for it costs less than a TLS handshake and a GET to a busy API server.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "want GET", http.StatusMethodNotAllowed)
		return
	}
	if name, ok := strings.CutPrefix(r.URL.Path, "/v1/namespaces/"); ok && name != "" && !strings.Contains(name, "/") {
		s.serve(w, s.namespaces, name, "namespace")
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/pods/")
	ns, name, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || ns == "" || name == "" {
		http.Error(w, "want GET /v1/pods/NAMESPACE/NAME or /v1/namespaces/NAME", http.StatusBadRequest)
		return
	}
	q := r.URL.Query()
	wait, err := parseWait(q.Get("wait"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	uid := q.Get("uid")
	if len(uid) > MaxUIDBytes {
		http.Error(w, fmt.Sprintf("uid: %d bytes, at most %d", len(uid), MaxUIDBytes), http.StatusBadRequest)
		return
	}
	if wait > 0 {
		s.awaitPod(r.Context(), ns+"/"+name, uid, wait)
	}
	s.serve(w, s.informer, ns+"/"+name, "pod")
}

// WaitCounts counts the pod requests that waited: found once the pod's event
// came, or answered without it at the end of their wait.
type WaitCounts struct{ Found, TimedOut atomic.Uint64 }

// MaxWait bounds the wait parameter of a pod request: how long the socket holds a
// request for a pod it does not hold yet.
const MaxWait = time.Second

// The bounds of one connection to pods.sock. A plugin asks once or twice and
// closes; a peer that sends nothing more on a kept-alive connection is dropped
// after IdleTimeout, and one that sends a request slowly after ReadTimeout,
// instead of holding a descriptor and a goroutine of the agent for ever.
// WriteTimeout counts from the end of the request's headers, so it exceeds the
// longest a request is held (MaxWait) by the time to answer it.
const (
	ReadTimeout  = 2 * time.Second
	IdleTimeout  = 2 * time.Second
	WriteTimeout = MaxWait + 2*time.Second
)

// MaxUIDBytes bounds the uid parameter of a pod request (a Kubernetes uid is a
// 36-byte UUID).
const MaxUIDBytes = 128

// parseWait reads the wait parameter: whole milliseconds, 0 to MaxWait.
func parseWait(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseUint(v, 10, 32)
	if err != nil || time.Duration(ms)*time.Millisecond > MaxWait {
		return 0, fmt.Errorf("wait=%q: want whole milliseconds from 0 to %d", v, MaxWait.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// notSyncedPoll is how often a held request looks again whether the informer has
// listed (its last list event may come before it counts as synced), and how often
// Run looks whether the pod files are written for every pod listed.
const notSyncedPoll = 10 * time.Millisecond

// awaitPod returns once the informer has listed and holds pod key (of uid, when
// given), or when wait or ctx ends.
func (s *Server) awaitPod(ctx context.Context, key, uid string, wait time.Duration) {
	var timer *time.Timer
	start := time.Now()
	for waited := false; ; waited = true {
		// The channel is taken before the look, so an event that comes after
		// the look closes it.
		events := s.podEvents.wait()
		synced := s.informer.HasSynced()
		if synced && s.holds(key, uid) {
			if waited {
				s.Waits.Found.Add(1)
				s.logger().Debug("pod cache: a held request found its pod", "pod", key, "waited", time.Since(start))
			}
			return
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		var poll <-chan time.Time
		if !synced {
			poll = time.After(notSyncedPoll)
		}
		select {
		case <-events:
		case <-poll:
		case <-ctx.Done():
			return
		case <-timer.C:
			s.Waits.TimedOut.Add(1)
			s.logger().Info("pod cache: a request waited for a pod the cache does not hold; the plugin asks the API server",
				"pod", key, "uid", uid, "waited", time.Since(start).Round(time.Millisecond), "synced", synced)
			return
		}
	}
}

// holds reports whether the pods' informer holds pod key, the sandbox's of uid when
// uid is given (a static pod's mirror by the static pod's uid: kube.HasSandboxUID).
func (s *Server) holds(key, uid string) bool {
	obj, exists, err := s.informer.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return false
	}
	pod, ok := obj.(*corev1.Pod)
	return ok && (uid == "" || kube.HasSandboxUID(string(pod.UID), pod.Annotations, uid))
}

func (s *Server) serve(w http.ResponseWriter, inf cache.SharedIndexInformer, key, kind string) {
	if !inf.HasSynced() {
		http.Error(w, kind+" cache not synced yet", http.StatusServiceUnavailable)
		return
	}
	obj, exists, err := inf.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		http.Error(w, kind+" not in the agent's cache", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(obj); err != nil && s.log != nil {
		s.log.Warn("pod cache: write answer", "error", err)
	}
}

// broadcast wakes every waiter at once: wait returns a channel that the next
// notify closes.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func newBroadcast() *broadcast { return &broadcast{ch: make(chan struct{})} }

func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}

// handler notifies at each add and update: the informer's store holds the object
// before its handlers are called.
func (b *broadcast) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { b.notify() },
		UpdateFunc: func(any, any) { b.notify() },
	}
}

// trimNamespace keeps what the plugin reads of a namespace, its name and labels
// (and what the informer needs), so the cluster's namespaces cost little memory.
func trimNamespace(obj any) (any, error) {
	if ns, ok := obj.(*corev1.Namespace); ok {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns.Name, UID: ns.UID, ResourceVersion: ns.ResourceVersion, Labels: ns.Labels,
		}}, nil
	}
	return obj, nil
}

func (s *Server) logger() *slog.Logger {
	if s.log == nil {
		return slog.Default()
	}
	return s.log
}
