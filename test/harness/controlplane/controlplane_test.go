package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/istio-cni/istio-cni/test/harness/wanterr"
)

func TestStartWithoutBinariesFailsNamingWhatIsMissing(t *testing.T) {
	empty := t.TempDir()
	_, err := Start(t.Context(), Options{BinDir: empty, TempDir: t.TempDir()})
	if err == nil {
		t.Fatal("Start succeeded with an empty BinDir")
	}
	wanterr.Mentions(t, err, filepath.Join(empty, "etcd"), filepath.Join(empty, "kube-apiserver"), "hack/kube-binaries.sh")
}

// The plugin's view of the cluster: a real ServiceAccount token whose RBAC lets it
// get pods and nothing else.
func TestServiceAccountAllowedOnlyToGetPodsGetsPodButCannotListPodsOrGetSecrets(t *testing.T) {
	root := t.TempDir()
	cp := StartForTest(t, Options{TempDir: root})
	t.Logf("control plane up in %v at %s", cp.StartupDuration().Round(time.Millisecond), cp.Host())
	ctx := t.Context()

	const ns, node = "workloads", "node-1"
	if err := cp.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// Secret to prove the token cannot read it even though it exists.
	if _, err := cp.AdminClient().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "db-password"},
		StringData: map[string]string{"password": "hunter2"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create secret: %v", err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        "app",
			Annotations: map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`},
		},
		Spec: corev1.PodSpec{
			NodeName:   node, // no scheduler runs
			Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app:1"}},
		},
	}
	if _, err := cp.AdminClient().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod (the namespace's default ServiceAccount must exist for admission): %v", err)
	}

	kubeconfig, err := cp.ServiceAccountKubeconfig(ctx, "istio-system", "istio-cni", []rbacv1.PolicyRule{
		{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"pods"}},
	})
	if err != nil {
		t.Fatalf("ServiceAccountKubeconfig: %v", err)
	}
	sa := KubeconfigClientForTest(t, kubeconfig)

	t.Run("kubeconfig carries a bearer token, no client certificate", func(t *testing.T) {
		cfg, err := clientcmd.LoadFromFile(kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		auth := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
		if auth.Token == "" || len(auth.ClientCertificateData) != 0 || auth.ClientCertificate != "" {
			t.Errorf("auth info: token set %v, client cert data %d bytes, client cert file %q; want token only",
				auth.Token != "", len(auth.ClientCertificateData), auth.ClientCertificate)
		}
	})

	t.Run("apiserver authenticates the token as the ServiceAccount", func(t *testing.T) {
		review, err := sa.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("self subject review: %v", err)
		}
		if diff := cmp.Diff("system:serviceaccount:istio-system:istio-cni", review.Status.UserInfo.Username); diff != "" {
			t.Errorf("username (-want +got):\n%s", diff)
		}
	})

	t.Run("get pod is allowed and returns the node and annotations", func(t *testing.T) {
		got, err := sa.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get pod: %v", err)
		}
		type view struct {
			Node        string
			Annotations map[string]string
		}
		want := view{Node: node, Annotations: pod.Annotations}
		if diff := cmp.Diff(want, view{Node: got.Spec.NodeName, Annotations: got.Annotations}); diff != "" {
			t.Errorf("pod (-want +got):\n%s", diff)
		}
	})

	t.Run("list pods is forbidden", func(t *testing.T) {
		_, err := sa.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("list pods: got err %v, want 403 Forbidden", err)
		}
	})

	t.Run("get secret is forbidden", func(t *testing.T) {
		_, err := sa.CoreV1().Secrets(ns).Get(ctx, "db-password", metav1.GetOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("get secret: got err %v, want 403 Forbidden", err)
		}
	})

	t.Run("calling again replaces the rules and issues a token that works", func(t *testing.T) {
		again, err := cp.ServiceAccountKubeconfig(ctx, "istio-system", "istio-cni", []rbacv1.PolicyRule{
			{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"pods"}},
		})
		if err != nil {
			t.Fatalf("ServiceAccountKubeconfig again: %v", err)
		}
		pods, err := KubeconfigClientForTest(t, again).CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list pods after granting list: %v", err)
		}
		if len(pods.Items) != 1 {
			t.Errorf("listed %d pods, want 1", len(pods.Items))
		}
		role, err := cp.AdminClient().RbacV1().ClusterRoles().Get(ctx, "controlplane:istio-system:istio-cni", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := []rbacv1.PolicyRule{{Verbs: []string{"list"}, APIGroups: []string{""}, Resources: []string{"pods"}}}
		if diff := cmp.Diff(want, role.Rules); diff != "" {
			t.Errorf("cluster role rules (-want +got):\n%s", diff)
		}
	})

	t.Run("kubernetes service endpoint is the advertised non-loopback address", func(t *testing.T) {
		// The apiserver's endpoint reconciler writes it shortly after readiness.
		var got []string
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
			slice, err := cp.AdminClient().DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			got = nil
			for _, ep := range slice.Endpoints {
				got = append(got, ep.Addresses...)
			}
			return len(got) > 0, nil
		})
		if err != nil {
			t.Fatalf("endpoint slice default/kubernetes: %v", err)
		}
		want, err := NonLoopbackIPv4()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{want.String()}, got); diff != "" {
			t.Errorf("kubernetes endpoints (-want +got):\n%s", diff)
		}
	})

	t.Run("admin kubeconfig is system:masters", func(t *testing.T) {
		admin := KubeconfigClientForTest(t, cp.AdminKubeconfig())
		review, err := admin.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("self subject review: %v", err)
		}
		if !slices.Contains(review.Status.UserInfo.Groups, "system:masters") {
			t.Errorf("admin groups %v lack system:masters", review.Status.UserInfo.Groups)
		}
	})

	t.Run("stop leaves no process and no files", func(t *testing.T) {
		pids := []int{cp.etcd.Pid(), cp.apiserver.Pid()}
		dir := cp.Dir()
		if err := cp.Stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
		assertNothingLeft(t, root, dir, pids)
		if err := cp.Stop(); err != nil {
			t.Errorf("second stop: %v", err)
		}
	})
}

func TestTwoControlPlanesStartInParallelAndAreIndependent(t *testing.T) {
	root := t.TempDir()
	cps := make([]*ControlPlane, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range cps {
		wg.Go(func() { cps[i], errs[i] = Start(t.Context(), Options{TempDir: root}) })
	}
	wg.Wait()
	for i, cp := range cps {
		if cp != nil {
			t.Cleanup(func() { cp.Stop() })
		}
		if errs[i] != nil {
			t.Fatalf("control plane %d: %v", i, errs[i])
		}
		t.Logf("control plane %d up in %v at %s", i, cp.StartupDuration().Round(time.Millisecond), cp.Host())
	}
	if cps[0].Host() == cps[1].Host() {
		t.Fatalf("both control planes serve %s", cps[0].Host())
	}
	ctx := t.Context()
	if err := cps[0].EnsureNamespace(ctx, "only-in-first"); err != nil {
		t.Fatal(err)
	}
	_, err := cps[1].AdminClient().CoreV1().Namespaces().Get(ctx, "only-in-first", metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("namespace made in the first control plane, seen from the second: err %v, want NotFound (separate etcd)", err)
	}
	var pids []int
	var dirs []string
	for _, cp := range cps {
		pids = append(pids, cp.etcd.Pid(), cp.apiserver.Pid())
		dirs = append(dirs, cp.Dir())
		if err := cp.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
	for _, dir := range dirs {
		assertNothingLeft(t, root, dir, pids)
	}
}

func TestApiserverThatCannotStartReportsItsLogAndLeavesNothing(t *testing.T) {
	root := t.TempDir()
	_, err := Start(t.Context(), Options{TempDir: root, ExtraAPIServerArgs: []string{"--no-such-flag"}})
	if err == nil {
		t.Fatal("Start succeeded with an unknown apiserver flag")
	}
	wanterr.Mentions(t, err, "kube-apiserver exited", "kube-apiserver.log", "unknown flag: --no-such-flag")
	assertNothingLeft(t, root, "", nil)
}

// assertNothingLeft checks that the given server pids are gone, that root (the
// Options.TempDir) is empty and dir no longer exists, and that no process on the
// machine still names root on its command line (catches a server whose pid we did
// not record, e.g. etcd of a failed start).
func assertNothingLeft(t *testing.T, root, dir string, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if !processGone(pid) {
			t.Errorf("process %d still exists after Stop", pid)
		}
	}
	if dir != "" {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("control plane dir %s still exists (stat err %v)", dir, err)
		}
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if len(left) > 0 {
		t.Errorf("left in %s: %v", root, left)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(cmdline), root) {
			t.Errorf("process %s still runs with %s on its command line: %q", filepath.Dir(p), root, strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
}
