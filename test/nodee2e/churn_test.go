package nodee2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/istio-cni/istio-cni/internal/repair"
	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// churnScenario is issue 16's zero-gap question put to a real node: while meshed
// pods keep being created at a steady rate, the agent is upgraded (new image and a
// changed value), killed, stopped, and the node rebooted. Does every pod still
// start captured? runChurn plays it; TestMeshedPodsStartCapturedThroughAgent... and
// BenchmarkMeshedPodsThroughAgentChurn share it.
type churnScenario struct {
	// Rate is how many pods the creator makes per second, all along.
	Rate float64
	// Before and After are how many pods each phase creates before its
	// disruption starts and after the agent is back; pods created in between (how
	// many depends on how long the disruption lasts) count for the phase too.
	Before, After int
	// Freeze is how long the agent stays stopped (SIGSTOP ... SIGCONT).
	Freeze time.Duration
	// Sample: every Sample-th pod that starts captured also has a request sent to
	// it from a resident meshed client, which must go through both proxies. 0: none.
	Sample int
	// Validation: every Validation-th pod carries Istio's istio-validation init
	// container, so that a pod started unredirected is seen by the repair
	// controller (which deletes it); the others, without it, start unprotected
	// instead. 0: none.
	Validation int
	// Residents live through the whole run (the first is the traffic client):
	// after the reboot, their new sandboxes must hold the rules again.
	Residents int
	// MaxInFlight bounds the pods on the node that are not yet classified and
	// deleted (kubelet admits 110 pods): the creator skips a tick above it.
	MaxInFlight int
	// StartBound is how long a pod may take from creation to Ready (or to the
	// repair controller's action) before it counts as never started.
	StartBound time.Duration
}

// defaultChurn is the scenario the test and the benchmark run: about 3 minutes.
func defaultChurn() churnScenario {
	return churnScenario{
		Rate: 5, Before: 8, After: 10,
		Freeze:      30 * time.Second,
		Sample:      10,
		Validation:  2,
		Residents:   4,
		MaxInFlight: 40,
		StartBound:  150 * time.Second,
	}
}

// The phases, in the order they run.
const (
	phaseUpgrade = "upgrade" // helm upgrade: a rebuilt image and logLevel
	phaseKill    = "kill"    // SIGKILL of the agent container
	phaseStop    = "stop"    // the agent's processes stopped for Freeze
	phaseReboot  = "reboot"  // node.Reboot: kubelet, containerd, agent as after a reboot
	// rowResidents is the table's row for the resident pods re-sandboxed by the reboot.
	rowResidents = "reboot: re-sandboxed residents"
)

var churnPhases = []string{phaseUpgrade, phaseKill, phaseStop, phaseReboot}

const churnNamespace = "churn"

// outcome is what became of one pod (or of a resident's sandbox after the reboot).
type outcome int

const (
	// captured: started with the ISTIO_ rules in its network namespace.
	captured outcome = iota
	// retried: its sandbox was refused (FailedCreatePodSandBox) at least once,
	// and it then started captured: failing closed, as the plugin should.
	retried
	// repaired: the repair controller acted on it (event, label or delete).
	repaired
	// unprotected: Running and Ready without the rules.
	unprotected
	// neverStarted: not Ready within the scenario's StartBound.
	neverStarted
	numOutcomes
)

func (o outcome) String() string {
	return [...]string{"captured", "refused+retried", "repaired", "unprotected", "never started"}[o]
}

// rulesCheck is the capture read from one app container's network namespace.
type rulesCheck struct {
	containerID string
	at          time.Time
	captured    bool
}

// podRecord is everything seen of one pod.
type podRecord struct {
	name, phase string
	resident    bool
	validation  bool
	sample      bool
	created     time.Time
	// sandboxReady is when the pod was first seen with its sandbox ready
	// (PodReadyToStartContainers, or an IP): the plugin's ADD has succeeded.
	sandboxReady time.Time
	// sandboxEvents are the FailedCreatePodSandBox events (name -> count), and the
	// first message.
	sandboxEvents map[string]int32
	sandboxMsg    string
	repairs       map[string]string // event name or "label"/"deleted" -> what
	deletedByUs   bool
	gone          bool
	createErr     error
	queued        map[string]bool // app container ids checked or queued
	checks        []rulesCheck
	checkErr      string // the last failed read of the rules
	// backAfterReboot is when a resident was first seen Ready in a new
	// container after the reboot began.
	backAfterReboot time.Time
	trafficDone     bool
	trafficErr      error
	// sampling is set while a sample's request is in flight: the checks of the
	// pod's later updates neither sample it again nor delete it (a CI run had two
	// samples of one pod at once; the first deleted the pod under the second).
	sampling   bool
	lastStatus string
}

func (r *podRecord) sandboxFailures() int {
	var n int
	for _, c := range r.sandboxEvents {
		n += int(max(c, 1))
	}
	return n
}

// churnTracker creates the pods and classifies them as their status and events
// arrive.
type churnTracker struct {
	tb   testing.TB
	sc   churnScenario
	s    *meshnode.Session // quiet: its output is not logged
	jobs chan checkJob
	// trafficGate is held for writing while the node reboots: requests through
	// kubectl exec would fail for reasons that are not the pod's.
	trafficGate sync.RWMutex

	mu        sync.Mutex
	pods      map[string]*podRecord
	phase     string
	perPhase  map[string]int
	throttled int
	// rebootAt is when the reboot began; residentIDs their app containers before it.
	rebootAt    time.Time
	residentIDs map[string]string
}

type checkJob struct {
	name string
	pod  *corev1.Pod
}

func newChurnTracker(tb testing.TB, s *meshnode.Session, sc churnScenario) *churnTracker {
	quiet := *s
	quiet.Out = discard{}
	return &churnTracker{tb: tb, sc: sc, s: &quiet, jobs: make(chan checkJob, 4096),
		pods: map[string]*podRecord{}, perPhase: map[string]int{}, residentIDs: map[string]string{}}
}

// start runs the informers on the namespace's pods and events and the checkers
// until ctx ends.
func (t *churnTracker) start(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(theNode.Client(), 0, informers.WithNamespace(churnNamespace))
	pods := f.Core().V1().Pods().Informer()
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.onPod(obj) },
		UpdateFunc: func(_, obj any) { t.onPod(obj) },
		DeleteFunc: func(obj any) { t.onPodDeleted(obj) },
	}); err != nil {
		return err
	}
	events := f.Core().V1().Events().Informer()
	if _, err := events.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.onEvent(obj) },
		UpdateFunc: func(_, obj any) { t.onEvent(obj) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer of %v did not sync", typ)
		}
	}
	for range 3 {
		go t.checker(ctx)
	}
	return nil
}

func (t *churnTracker) onPod(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.pods[p.Name]
	if r == nil {
		return
	}
	if r.sandboxReady.IsZero() && sandboxReady(p) {
		r.sandboxReady = now
	}
	if p.Labels[repair.DefaultLabelKey] == repair.DefaultLabelValue {
		r.repairs["label"] = "labelled " + repair.DefaultLabelKey
	}
	r.lastStatus = podStatusLine(p)
	if !podIsReady(p) || p.DeletionTimestamp != nil {
		return
	}
	if id := containerID(p, "app"); id != "" && !r.queued[id] {
		r.queued[id] = true
		if r.resident && !t.rebootAt.IsZero() && r.backAfterReboot.IsZero() {
			r.backAfterReboot = now
		}
		t.jobs <- checkJob{name: p.Name, pod: p.DeepCopy()}
	}
}

func (t *churnTracker) onPodDeleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.pods[p.Name]; r != nil {
		r.gone = true
		if !r.deletedByUs {
			r.repairs["deleted"] = "deleted, not by the test (the repair controller deletes broken pods)"
		}
	}
}

func (t *churnTracker) onEvent(obj any) {
	e, ok := obj.(*corev1.Event)
	if !ok || e.InvolvedObject.Kind != "Pod" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.pods[e.InvolvedObject.Name]
	if r == nil {
		return
	}
	switch {
	case e.Reason == "FailedCreatePodSandBox":
		r.sandboxEvents[e.Name] = e.Count
		if r.sandboxMsg == "" {
			r.sandboxMsg = e.Message
		}
	case e.Source.Component == repair.EventComponent || slices.Contains([]string{repair.ReasonRepairBrokenPod,
		repair.ReasonDeleteBrokenPod, repair.ReasonLabelBrokenPod, repair.ReasonRepairGaveUp}, e.Reason):
		r.repairs[e.Name] = e.Reason + ": " + e.Message
	}
}

// checker reads the rules of each Ready pod's new sandbox, sends a sample of them
// a request, and deletes the pods that are not residents.
func (t *churnTracker) checker(ctx context.Context) {
	for {
		var job checkJob
		select {
		case <-ctx.Done():
			return
		case job = <-t.jobs:
		}
		id := containerID(job.pod, "app")
		out, err := t.readRules(ctx, job.pod, id)
		t.mu.Lock()
		r := t.pods[job.name]
		if err != nil {
			r.checkErr = err.Error()
			t.mu.Unlock()
			continue
		}
		ok := meshnode.Captured(out)
		r.checks = append(r.checks, rulesCheck{containerID: id, at: time.Now(), captured: ok})
		sampling := r.sampling
		sample := ok && r.sample && !r.trafficDone && !sampling
		if sample {
			r.sampling = true
		}
		resident := r.resident
		checkedAt := r.checks[len(r.checks)-1].at
		t.mu.Unlock()
		if sample {
			// A request may have to wait out a reboot, and the reboot waits for the
			// residents' checks: the checkers go on meanwhile.
			go t.sample(ctx, job.name, checkedAt)
			continue
		}
		if sampling {
			continue // the sample in flight records the pod and deletes it
		}
		if !resident {
			t.delete(ctx, job.name)
		}
	}
}

// errCheckedBeforeReboot says that the sandbox whose rules were checked is gone:
// the node rebooted after the check.
var errCheckedBeforeReboot = errors.New("the sandbox checked is gone: the node rebooted after the check")

// sample sends a sampled pod its request, records it and deletes the pod. A
// sample voided by a reboot is not recorded and the pod is kept: the check of its
// new sandbox samples it again, or this goroutine does when that check came while
// it waited. One sample of a pod is in flight at a time (sampling).
func (t *churnTracker) sample(ctx context.Context, name string, checkedAt time.Time) {
	err := t.checkTraffic(ctx, name, checkedAt)
	t.mu.Lock()
	r := t.pods[name]
	if errors.Is(err, errCheckedBeforeReboot) {
		// Its new sandbox may have been checked while this sample waited (that
		// check did not sample it, this one being in flight): sample that one.
		if last := r.checks[len(r.checks)-1]; last.at.After(checkedAt) && last.captured {
			t.mu.Unlock()
			t.sample(ctx, name, last.at)
			return
		}
		r.sampling = false
		t.mu.Unlock()
		return
	}
	r.sampling = false
	r.trafficDone, r.trafficErr = true, err
	t.mu.Unlock()
	t.delete(ctx, name)
}

// readRules reads the rules of the pod's app container id, trying again for up to
// 10 s while that container still runs: the runtime may be a moment behind the
// status. It gives up at once when the pod has another container or is gone (a
// new job comes with the new container).
func (t *churnTracker) readRules(ctx context.Context, p *corev1.Pod, id string) (string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, out, err := meshnode.Rules(ctx, theNode, p)
		if err == nil {
			return out, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", err
		}
		time.Sleep(500 * time.Millisecond)
		fresh, gerr := theNode.Client().CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if gerr != nil || containerID(fresh, "app") != id {
			return "", err
		}
		p = fresh
	}
}

func (t *churnTracker) delete(ctx context.Context, name string) {
	t.mu.Lock()
	t.pods[name].deletedByUs = true
	t.mu.Unlock()
	err := theNode.Client().CoreV1().Pods(churnNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil && ctx.Err() == nil {
		t.tb.Logf("delete pod %s: %v", name, err)
	}
}

// checkTraffic sends a request from the first resident to the pod (both as they
// are now) and proves it went out through the client's proxy and in through the
// pod's.
func (t *churnTracker) checkTraffic(ctx context.Context, name string, checkedAt time.Time) error {
	if err := t.enterTraffic(ctx); err != nil {
		return err
	}
	defer t.trafficGate.RUnlock()
	t.mu.Lock()
	voided := !t.rebootAt.IsZero() && checkedAt.Before(t.rebootAt)
	t.mu.Unlock()
	if voided {
		return errCheckedBeforeReboot
	}
	// The pod is Ready once its proxy is (the app container has no probe), so its app
	// may not listen yet: a request is tried again for a few seconds. Only a request
	// that went through both proxies counts.
	// A failed exec (kubectl could not run the request in resident-0: the kubelet
	// or the runtime, busy with the phase's disruption, refused or timed out)
	// says nothing about the capture, so it is tried again for longer.
	began := time.Now()
	for {
		err := t.requestOnce(ctx, residentName(0), name)
		if err == nil || ctx.Err() != nil {
			return err
		}
		bound := requestRetryBound
		if meshnode.ExecFailed(err) {
			bound = execRetryBound
		}
		if time.Since(began) > bound {
			return fmt.Errorf("%w\n%s", err, t.diagnose(ctx, residentName(0), name))
		}
		time.Sleep(time.Second)
	}
}

// requestRetryBound bounds the retries of a sample whose request failed (the app
// may not listen yet when its pod is Ready); execRetryBound those of a sample
// whose kubectl exec failed before the request could be made.
const (
	requestRetryBound = 10 * time.Second
	execRetryBound    = time.Minute
)

// diagnose gathers what tells a failed sample's causes apart: both pods' status,
// the app pod's rules, the ends of both proxies' logs and of the app's, and the
// agent's log lines that name either pod.
func (t *churnTracker) diagnose(ctx context.Context, clientName, appName string) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var b strings.Builder
	pods := theNode.Client().CoreV1().Pods(churnNamespace)
	for _, name := range []string{clientName, appName} {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			fmt.Fprintf(&b, "  pod %s: %v\n", name, err)
			continue
		}
		fmt.Fprintf(&b, "  pod %s: %s, IP %s\n", name, podStatusLine(p), p.Status.PodIP)
		for _, c := range []string{"istio-proxy", "app"} {
			log, err := t.s.Kubectl(ctx, "logs", "-n", churnNamespace, name, "-c", c, "--tail=8")
			fmt.Fprintf(&b, "  %s/%s log (err %v):\n%s", name, c, err, indent(log))
		}
		if name == appName {
			_, rules, err := meshnode.Rules(ctx, theNode, p)
			fmt.Fprintf(&b, "  %s rules (err %v):\n%s", name, err, indent(rules))
			if p.Status.PodIP != "" {
				out, err := exec.CommandContext(ctx, "ip", "route", "get", p.Status.PodIP).CombinedOutput()
				fmt.Fprintf(&b, "  the node's route to %s (err %v):\n%s", p.Status.PodIP, err, indent(string(out)))
				out, err = exec.CommandContext(ctx, "ip", "neigh", "show", p.Status.PodIP).CombinedOutput()
				fmt.Fprintf(&b, "  the node's neighbour entries for %s (err %v):\n%s", p.Status.PodIP, err, indent(string(out)))
			}
		}
	}
	log, err := t.s.Kubectl(ctx, "logs", "-n", meshnode.Namespace, "daemonset/istio-cni-node", "-c", "install-cni", "--tail=2000")
	fmt.Fprintf(&b, "  agent log lines naming %s or %s (err %v):\n", clientName, appName, err)
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, clientName) || strings.Contains(line, appName) {
			fmt.Fprintf(&b, "    %s\n", line)
		}
	}
	return b.String()
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ") + "\n"
}

// clientBackBound bounds the wait of a sample for the client resident to be back
// in a new sandbox after the reboot (the reboot's own bound).
const clientBackBound = 3 * time.Minute

// enterTraffic takes the traffic gate for reading once the client resident is
// in a sandbox that is there to stay: before the reboot began, or back in a new
// sandbox after it (one CI run sampled a pod while resident-0 was still down
// from the reboot, for longer than a request's retries). It waits outside the
// gate, which the reboot takes for writing after it has begun.
func (t *churnTracker) enterTraffic(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, clientBackBound)
	defer cancel()
	for {
		t.trafficGate.RLock()
		t.mu.Lock()
		back := t.rebootAt.IsZero() || !t.pods[residentName(0)].backAfterReboot.IsZero()
		t.mu.Unlock()
		if back {
			return nil
		}
		t.trafficGate.RUnlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not back in a new sandbox %s after the reboot began: %w", residentName(0), clientBackBound, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// requestOnce reads both pods as they are now and sends one request from client
// to app's IP. Both are read for each try: a pod the watch saw Ready may have
// no IP by the time its turn comes (one CI run read stop-042 with an empty
// PodIP, and the request to ":8080" went to the client's own app), and a
// request to no address proves nothing about the capture.
func (t *churnTracker) requestOnce(ctx context.Context, clientName, appName string) error {
	pods := theNode.Client().CoreV1().Pods(churnNamespace)
	client, err := pods.Get(ctx, clientName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	app, err := pods.Get(ctx, appName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, p := range []*corev1.Pod{client, app} {
		if p.Status.PodIP == "" {
			return fmt.Errorf("request %s -> %s: pod %s has no IP (%s)", clientName, appName, p.Name, podStatusLine(p))
		}
	}
	return requestThroughProxies(ctx, t.s, client, app, net.JoinHostPort(app.Status.PodIP, "8080"), "127.0.0.6")
}

func residentName(i int) string { return fmt.Sprintf("resident-%d", i) }

// add registers a pod before it is created, so that no status or event of it is
// missed.
func (t *churnTracker) add(p *corev1.Pod, phase string, resident, validation, sample bool) *podRecord {
	r := &podRecord{name: p.Name, phase: phase, resident: resident, validation: validation, sample: sample,
		created: time.Now(), sandboxEvents: map[string]int32{}, repairs: map[string]string{}, queued: map[string]bool{}}
	t.mu.Lock()
	t.pods[p.Name] = r
	t.mu.Unlock()
	return r
}

// createResidents creates the residents and waits until each has started captured.
func (t *churnTracker) createResidents(ctx context.Context) error {
	var pods []*corev1.Pod
	for i := range t.sc.Residents {
		p := meshnode.MeshedPod(churnNamespace, residentName(i))
		t.add(p, "resident", true, false, false)
		pods = append(pods, p)
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if _, err := meshnode.CreatePods(wctx, theNode, pods...); err != nil {
		return err
	}
	return t.waitFor(wctx, "the residents started captured", func() (bool, string) {
		for i := range t.sc.Residents {
			r := t.pods[residentName(i)]
			if len(r.checks) == 0 {
				return false, r.name + ": " + r.lastStatus
			}
			if !r.checks[0].captured {
				return false, r.name + " started without the rules"
			}
		}
		return true, ""
	})
}

// waitFor polls cond (called with t.mu held) until it holds or ctx ends.
func (t *churnTracker) waitFor(ctx context.Context, what string, cond func() (bool, string)) error {
	for {
		t.mu.Lock()
		ok, last := cond()
		t.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %s)", what, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// create makes pods at the scenario's rate, each counted for the phase current at
// its creation, until stop ends; the API calls run under ctx, so that the last
// pod is created or not, never left in doubt.
func (t *churnTracker) create(ctx, stop context.Context) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / t.sc.Rate))
	defer tick.Stop()
	var seq int
	for {
		select {
		case <-stop.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		if t.inFlight() >= t.sc.MaxInFlight {
			t.throttled++
			t.mu.Unlock()
			continue
		}
		phase := t.phase
		name := fmt.Sprintf("%s-%03d", phase, t.perPhase[phase])
		t.perPhase[phase]++
		t.mu.Unlock()
		seq++
		p := meshnode.MeshedPod(churnNamespace, name)
		p.Labels["churn-phase"] = phase
		validation := t.sc.Validation > 0 && seq%t.sc.Validation == 0
		if validation {
			meshnode.WithValidation(p)
		}
		r := t.add(p, phase, false, validation, t.sc.Sample > 0 && seq%t.sc.Sample == 0)
		_, err := theNode.Client().CoreV1().Pods(churnNamespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.mu.Lock()
			r.createErr = err
			t.mu.Unlock()
		}
	}
}

// inFlight counts the created pods still on the node (t.mu held).
func (t *churnTracker) inFlight() int {
	var n int
	for _, r := range t.pods {
		if !r.resident && !r.gone && r.createErr == nil {
			n++
		}
	}
	return n
}

func (t *churnTracker) setPhase(p string) {
	t.mu.Lock()
	t.phase = p
	t.mu.Unlock()
}

// waitCreated waits until the phase has n pods.
func (t *churnTracker) waitCreated(ctx context.Context, phase string, n int) error {
	return t.waitFor(ctx, fmt.Sprintf("%d pods created in phase %s", n, phase), func() (bool, string) {
		return t.perPhase[phase] >= n, fmt.Sprintf("%d created, %d on the node", t.perPhase[phase], t.inFlight())
	})
}

// settled says whether nothing more is to be learnt about a pod: it started (and
// was checked), it is gone, or its StartBound has passed (t.mu held).
func (t *churnTracker) settled(r *podRecord, now time.Time) bool {
	if r.createErr != nil || r.gone || now.Sub(r.created) > t.sc.StartBound {
		return true
	}
	return len(r.checks) > 0 && (!r.sample || r.trafficDone || !r.checks[0].captured)
}

// waitSettled waits until every pod is settled.
func (t *churnTracker) waitSettled(ctx context.Context) error {
	return t.waitFor(ctx, "every pod classified", func() (bool, string) {
		now := time.Now()
		var open []string
		for _, r := range t.pods {
			if !t.settled(r, now) {
				open = append(open, r.name)
			}
		}
		slices.Sort(open)
		return len(open) == 0, fmt.Sprintf("%d open: %v", len(open), open[:min(len(open), 10)])
	})
}

// churnRow is one line of the table: the outcomes of a phase's pods.
type churnRow struct {
	Name     string
	Created  int
	Outcomes [numOutcomes]int
	// TrafficChecked and TrafficFailed count the sampled requests.
	TrafficChecked, TrafficFailed int
	// MaxWait and MedianWait are creation -> sandbox ready.
	MaxWait, MedianWait time.Duration
	waits               []time.Duration
}

// churnResult is what runChurn measured.
type churnResult struct {
	Rows      []churnRow
	Problems  []string // one line per pod that did not start captured, or a failed sample
	MaxWait   time.Duration
	Throttled int
	// Created counts the pods the creator made, at AchievedRate a second on
	// average over the run for a target of Rate (fewer when the node could not keep
	// MaxInFlight pods moving).
	Created            int
	Rate, AchievedRate float64
	Took               time.Duration
	// Uninstall is what helm uninstall left different in the CNI dirs (nil: nothing).
	Uninstall error
}

func (r *churnResult) total(o outcome) int {
	var n int
	for _, row := range r.Rows {
		n += row.Outcomes[o]
	}
	return n
}

// classify decides the outcome of a pod from what was seen (t.mu held).
func (t *churnTracker) classify(r *podRecord) (outcome, string) {
	if len(r.repairs) > 0 {
		var what []string
		for _, w := range r.repairs {
			what = append(what, w)
		}
		slices.Sort(what)
		return repaired, strings.Join(what, "; ")
	}
	for _, c := range r.checks {
		if !c.captured {
			return unprotected, "Ready without the ISTIO_ rules in its netns (container " + shortContainer(c.containerID) + ")"
		}
	}
	switch {
	case len(r.checks) > 0 && r.sandboxFailures() > 0:
		return retried, fmt.Sprintf("%d sandbox failures, first: %s", r.sandboxFailures(), r.sandboxMsg)
	case len(r.checks) > 0:
		return captured, ""
	}
	why := "not Ready: " + r.lastStatus
	if r.createErr != nil {
		why = "create: " + r.createErr.Error()
	} else if r.checkErr != "" {
		why += "; reading its rules: " + r.checkErr
	}
	if r.sandboxFailures() > 0 {
		why += fmt.Sprintf("; %d sandbox failures, first: %s", r.sandboxFailures(), r.sandboxMsg)
	}
	return neverStarted, why
}

// classifyResident decides what became of a resident's sandbox after the reboot
// (t.mu held).
func (t *churnTracker) classifyResident(r *podRecord) (outcome, string) {
	if len(r.repairs) > 0 {
		return t.classify(r)
	}
	var after []rulesCheck
	for _, c := range r.checks {
		if c.containerID != t.residentIDs[r.name] && c.at.After(t.rebootAt) {
			after = append(after, c)
		}
	}
	if len(after) == 0 {
		return neverStarted, "no new sandbox after the reboot: " + r.lastStatus
	}
	for _, c := range after {
		if !c.captured {
			return unprotected, "re-sandboxed without the ISTIO_ rules (container " + shortContainer(c.containerID) + ")"
		}
	}
	if r.sandboxFailures() > 0 {
		return retried, fmt.Sprintf("%d sandbox failures, first: %s", r.sandboxFailures(), r.sandboxMsg)
	}
	return captured, ""
}

func (t *churnTracker) result() *churnResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	res := &churnResult{Throttled: t.throttled, Rate: t.sc.Rate}
	var first, last time.Time
	rows := map[string]*churnRow{}
	for _, name := range append(slices.Clone(churnPhases), rowResidents) {
		rows[name] = &churnRow{Name: name}
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range t.pods {
			if !yield(n) {
				return
			}
		}
	})
	for _, name := range names {
		r := t.pods[name]
		var row *churnRow
		var o outcome
		var why string
		if r.resident {
			row = rows[rowResidents]
			o, why = t.classifyResident(r)
			if !r.backAfterReboot.IsZero() {
				row.waits = append(row.waits, r.backAfterReboot.Sub(t.rebootAt))
			}
		} else {
			row = rows[r.phase]
			o, why = t.classify(r)
			if first.IsZero() || r.created.Before(first) {
				first = r.created
			}
			if r.created.After(last) {
				last = r.created
			}
			res.Created++
			if !r.sandboxReady.IsZero() {
				row.waits = append(row.waits, r.sandboxReady.Sub(r.created))
			}
		}
		row.Created++
		row.Outcomes[o]++
		if o != captured && o != retried {
			res.Problems = append(res.Problems, fmt.Sprintf("%s (%s): %s: %s", name, r.phase, o, why))
		}
		if r.trafficDone {
			row.TrafficChecked++
			if r.trafficErr != nil {
				row.TrafficFailed++
				res.Problems = append(res.Problems, fmt.Sprintf("%s (%s): traffic: %v", name, r.phase, r.trafficErr))
			}
		}
	}
	for _, name := range append(slices.Clone(churnPhases), rowResidents) {
		row := rows[name]
		if len(row.waits) > 0 {
			slices.Sort(row.waits)
			row.MaxWait, row.MedianWait = row.waits[len(row.waits)-1], row.waits[len(row.waits)/2]
			if name != rowResidents {
				res.MaxWait = max(res.MaxWait, row.MaxWait)
			}
		}
		res.Rows = append(res.Rows, *row)
	}
	if res.Created > 1 {
		res.AchievedRate = float64(res.Created-1) / last.Sub(first).Seconds()
	}
	return res
}

// table renders the result, one row per phase.
func (r *churnResult) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-31s %7s %8s %15s %8s %11s %13s %9s %10s %10s\n", "phase", "created", "captured", "refused+retried",
		"repaired", "unprotected", "never started", "traffic", "wait p50", "wait max")
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "%-31s %7d %8d %15d %8d %11d %13d %9s %10s %10s\n", row.Name, row.Created,
			row.Outcomes[captured], row.Outcomes[retried], row.Outcomes[repaired], row.Outcomes[unprotected], row.Outcomes[neverStarted],
			fmt.Sprintf("%d/%d", row.TrafficChecked-row.TrafficFailed, row.TrafficChecked),
			row.MedianWait.Round(10*time.Millisecond), row.MaxWait.Round(10*time.Millisecond))
	}
	fmt.Fprintf(&b, "waits: pod created -> sandbox ready; for the residents, reboot began -> Ready in a new sandbox\n")
	fmt.Fprintf(&b, "longest wait for the plugin: %s; %d pods created at %.1f/s on average (target %.1f/s; %d ticks skipped with too many pods in flight); took %s",
		r.MaxWait.Round(10*time.Millisecond), r.Created, r.AchievedRate, r.Rate, r.Throttled, r.Took.Round(time.Second))
	return b.String()
}

// runChurn plays the scenario on the test node with the chart installed and
// uninstalled by it, and returns what it measured; logf gets a line per phase. It fails tb only when the
// scenario itself cannot run (the agent never comes back, a tool fails); what
// became of the pods is in the result, for the caller to judge.
func runChurn(tb testing.TB, s *meshnode.Session, sc churnScenario, logf func(format string, args ...any)) *churnResult {
	tb.Helper()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := meshnode.EnsureNamespace(ctx, theNode, churnNamespace); err != nil {
		tb.Fatal(err)
	}
	confBefore := confDir(tb)
	binsBefore, err := meshnode.BinDir(theNode)
	if err != nil {
		tb.Fatal(err)
	}
	const nextTag = "dev-next"
	nextDigest, err := theImages.RebuildAgent(ctx, theNode, nextTag)
	if err != nil {
		tb.Fatal(err)
	}
	base := values(tb) // the same ports for install and upgrade
	install(tb, s, base)

	t := newChurnTracker(tb, s, sc)
	tctx, stopTracker := context.WithCancel(ctx)
	defer stopTracker()
	if err := t.start(tctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { deleteAllPods(tb, churnNamespace) })
	defer func() {
		if tb.Failed() { // a phase could not run: what was seen until then
			tb.Logf("outcomes so far (pods still starting count as never started):\n%s", t.result().table())
		}
	}()
	if err := t.createResidents(ctx); err != nil {
		tb.Fatal(err)
	}
	t.setPhase(churnPhases[0])
	cctx, stopCreator := context.WithCancel(ctx)
	defer stopCreator()
	created := make(chan struct{})
	go func() { t.create(ctx, cctx); close(created) }()

	for _, phase := range churnPhases {
		t.setPhase(phase)
		if err := t.waitCreated(ctx, phase, sc.Before); err != nil {
			tb.Fatal(err)
		}
		began := time.Now()
		var err error
		switch phase {
		case phaseUpgrade:
			err = upgradeAgent(ctx, tb, s, base, nextTag, nextDigest)
		case phaseKill:
			err = killAgent(ctx)
		case phaseStop:
			err = freezeAgent(ctx, sc.Freeze, logf)
		case phaseReboot:
			err = t.reboot(ctx)
		}
		if err != nil {
			tb.Fatalf("phase %s: %v", phase, err)
		}
		t.mu.Lock()
		during := t.perPhase[phase]
		t.mu.Unlock()
		logf("phase %s: disruption over and the agent Ready after %s, %d pods created so far in the phase",
			phase, time.Since(began).Round(100*time.Millisecond), during)
		if err := t.waitCreated(ctx, phase, during+sc.After); err != nil {
			tb.Fatal(err)
		}
	}
	stopCreator()
	<-created
	sctx, cancelSettle := context.WithTimeout(ctx, sc.StartBound+time.Minute)
	defer cancelSettle()
	if err := t.waitSettled(sctx); err != nil {
		tb.Fatal(err)
	}
	res := t.result()
	stopTracker()

	// Pods go first, while the plugin can still run their DEL.
	deleteAllPods(tb, churnNamespace)
	if err := s.Uninstall(ctx); err != nil {
		tb.Fatal(err)
	}
	var diffs []error
	if err := meshnode.SameDir(confBefore, confDir(tb)); err != nil {
		diffs = append(diffs, fmt.Errorf("conf dir: %w", err))
	}
	if bins, err := meshnode.BinDir(theNode); err != nil || !slices.Equal(bins, meshnode.AfterUninstall(binsBefore)) {
		diffs = append(diffs, fmt.Errorf("bin dir %v (%v), want %v", bins, err, meshnode.AfterUninstall(binsBefore)))
	}
	res.Uninstall = errors.Join(diffs...)
	res.Took = time.Since(began)
	return res
}

// upgradeAgent runs helm upgrade to the rebuilt image with another plugin log
// level and waits until the new agent is Ready and the entry shows the new level.
func upgradeAgent(ctx context.Context, tb testing.TB, s *meshnode.Session, base []string, tag, digest string) error {
	quiet := *s
	quiet.Out = discard{}
	vals := append(slices.Clone(base), "--set", "tag="+tag, "--set", "digest="+digest, "--set", "logLevel=debug")
	if err := quiet.Upgrade(ctx, vals); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if _, err := waitAgent(wctx, "Ready with image "+digest, func(p *corev1.Pod) bool {
		return strings.HasSuffix(p.Spec.Containers[0].Image, digest)
	}); err != nil {
		return err
	}
	for {
		if e := istioEntry(tb); e != nil && e["plugin_log_level"] == "debug" {
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("the entry has no plugin_log_level debug: %w", wctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// killAgent kills the agent container's process with SIGKILL and waits until the
// kubelet has restarted it in the same pod and it is Ready.
func killAgent(ctx context.Context) error {
	agent, err := meshnode.WaitAgentReady(ctx, theNode, meshnode.Namespace)
	if err != nil {
		return err
	}
	restarts := restartCount(agent, "install-cni")
	pid, err := meshnode.PID(ctx, theNode, agent, "install-cni")
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill -9 %d: %w", pid, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	_, err = waitAgent(wctx, "restarted in the same pod", func(p *corev1.Pod) bool {
		return p.UID == agent.UID && restartCount(p, "install-cni") > restarts
	})
	return err
}

// freezeAgent stops every process of the agent container with SIGSTOP for d, then
// sends SIGCONT, and waits for the agent to be Ready. A stopped process is a hung
// agent as the node sees it: its probes go unanswered, its sockets accept but never
// answer; the liveness probe (3 failures, 5 s apart) has the kubelet restart the
// container within the freeze, which is part of what this phase shows (the log
// says whether it happened). SIGSTOP rather than the cgroup freezer (ctr tasks
// pause): a process in a frozen cgroup v1 does not die of SIGKILL until it is
// thawed, so the kubelet's restart would hang, which no real hang does.
func freezeAgent(ctx context.Context, d time.Duration, logf func(format string, args ...any)) error {
	agent, err := meshnode.WaitAgentReady(ctx, theNode, meshnode.Namespace)
	if err != nil {
		return err
	}
	restarts := restartCount(agent, "install-cni")
	id := containerID(agent, "install-cni")
	out, err := exec.CommandContext(ctx, theNode.Ctr(), "-a", theNode.ContainerdSocket(), "-n", "k8s.io", "tasks", "ps", id).Output()
	if err != nil {
		return fmt.Errorf("ctr tasks ps %s: %w", id, err)
	}
	var pids []int
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			if pid, err := strconv.Atoi(f[0]); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	if len(pids) == 0 {
		return fmt.Errorf("ctr tasks ps %s: no processes: %s", id, out)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("kill -STOP %d: %w", pid, err)
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	for _, pid := range pids {
		// Gone if the kubelet restarted the container meanwhile.
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill -CONT %d: %w", pid, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	now, err := waitAgent(wctx, "Ready after the freeze", func(*corev1.Pod) bool { return true })
	if err == nil {
		logf("phase stop: %d processes stopped for %s; the kubelet restarted the agent container %d times meanwhile",
			len(pids), d, restartCount(now, "install-cni")-restarts)
	}
	return err
}

// reboot reboots the node (with the agent's run dir and the netns dir, which are on
// tmpfs on a real node), waits for the agent to be Ready, and for every resident to
// be Ready in a new sandbox.
func (t *churnTracker) reboot(ctx context.Context) error {
	t.mu.Lock()
	t.rebootAt = time.Now()
	for i := range t.sc.Residents {
		r := t.pods[residentName(i)]
		t.residentIDs[r.name] = r.checks[len(r.checks)-1].containerID
	}
	t.mu.Unlock()
	t.trafficGate.Lock()
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err := theNode.Reboot(rctx, meshnode.AgentRunDir(theNode), meshnode.NetnsDir(theNode))
	t.trafficGate.Unlock()
	if err != nil {
		return err
	}
	if _, err := waitAgent(rctx, "Ready after the reboot", func(*corev1.Pod) bool { return true }); err != nil {
		return err
	}
	if err := t.waitFor(rctx, "the residents in new sandboxes", func() (bool, string) {
		for i := range t.sc.Residents {
			r := t.pods[residentName(i)]
			if last := r.checks[len(r.checks)-1]; last.containerID == t.residentIDs[r.name] {
				return false, r.name + ": " + r.lastStatus
			}
		}
		return true, ""
	}); err != nil {
		return err
	}
	// Traffic between the residents' new sandboxes, through their proxies.
	for i := 1; i < t.sc.Residents; i++ {
		err := t.requestOnce(ctx, residentName(0), residentName(i))
		t.mu.Lock()
		r := t.pods[residentName(i)]
		r.trafficDone, r.trafficErr = true, err
		t.mu.Unlock()
	}
	return nil
}

// waitAgent waits for a Ready agent pod for which ok holds and returns it.
func waitAgent(ctx context.Context, what string, ok func(*corev1.Pod) bool) (*corev1.Pod, error) {
	var last string
	for {
		pods, err := theNode.Client().CoreV1().Pods(meshnode.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=istio-cni-node"})
		if err == nil {
			last = fmt.Sprintf("%d agent pods", len(pods.Items))
			for i := range pods.Items {
				p := &pods.Items[i]
				if p.DeletionTimestamp == nil && podIsReady(p) && ok(p) {
					return p, nil
				}
				last += "; " + podStatusLine(p)
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the agent %s: %w (last: %s)", what, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// deleteAllPods deletes the namespace's pods and waits (up to 2 minutes) until
// they are gone.
func deleteAllPods(tb testing.TB, namespace string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pods := theNode.Client().CoreV1().Pods(namespace)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
		tb.Errorf("delete the pods of %s: %v", namespace, err)
		return
	}
	for {
		list, err := pods.List(ctx, metav1.ListOptions{})
		if err == nil && len(list.Items) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			n := -1
			if list != nil {
				n = len(list.Items)
			}
			tb.Errorf("%d pods of %s still there after 2 minutes", n, namespace)
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func containerID(p *corev1.Pod, name string) string {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == name && cs.State.Running != nil {
			return strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	return ""
}

func restartCount(p *corev1.Pod, name string) int32 {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == name {
			return cs.RestartCount
		}
	}
	return 0
}

func shortContainer(id string) string { return id[:min(len(id), 12)] }

// sandboxReady says whether the pod's sandbox is up with its network: the
// kubelet's PodReadyToStartContainers condition, or an IP.
func sandboxReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return p.Status.PodIP != ""
}

// podStatusLine says where a pod is: its phase, unmet conditions, waiting or
// terminated containers.
func podStatusLine(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", p.Name, p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			fmt.Fprintf(&b, "; %s: %s", c.Type, c.Message)
		}
	}
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			fmt.Fprintf(&b, "; %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil {
			fmt.Fprintf(&b, "; %s exited %d (%s)", cs.Name, t.ExitCode, t.Reason)
		}
	}
	return b.String()
}
