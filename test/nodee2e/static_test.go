package nodee2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/istio-cni/istio-cni/internal/kube"
	"github.com/istio-cni/istio-cni/test/nodee2e/meshnode"
)

// A static pod (a manifest in the kubelet's staticPodPath) runs under the uid the
// kubelet gives it, and the runtime passes that uid as K8S_POD_UID. The kubelet
// mirrors the pod into the API server, which gives the mirror a uid of its own and
// keeps the static pod's in its kubernetes.io/config.mirror annotation. The plugin
// must take the mirror for the sandbox's pod (as Istio's plugin, which reads the
// pod by name, does) and capture it; before, it took the mirror for another pod of
// the same name and failed every ADD, so the static pod never started.
func TestAStaticPodIsCapturedLikeAnyOtherPod(t *testing.T) {
	s := session(t)
	ctx := context.Background()
	install(t, s, values(t))

	const ns = "static"
	if err := meshnode.EnsureNamespace(ctx, theNode, ns); err != nil {
		t.Fatal(err)
	}
	client := createPods(t, meshnode.MeshedPod(ns, "client"))[0]

	static := meshnode.MeshedPod(ns, "web")
	static.APIVersion, static.Kind = "v1", "Pod"
	manifest, err := json.Marshal(static)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(theNode.StaticPodDir(), "web.json")
	if err := os.WriteFile(path, manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	mirror := static.Name + "-" + theNode.Name() // the kubelet's name for it
	t.Cleanup(func() {
		os.Remove(path)
		// The kubelet stops the pod and deletes its mirror.
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := theNode.Client().CoreV1().Pods(ns).Get(context.Background(), mirror, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Errorf("static pod %s/%s: its mirror is still there 60 s after its manifest was removed", ns, mirror)
	})

	waitCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	app, err := meshnode.WaitPodReady(waitCtx, theNode, ns, mirror)
	if err != nil {
		t.Fatalf("static pod: %v", err)
	}
	// The case this test is about: the API server's pod has another uid than the
	// kubelet's, which the mirror annotation holds.
	if staticUID := app.Annotations[kube.MirrorAnnotation]; staticUID == "" || staticUID == string(app.UID) {
		t.Fatalf("pod %s/%s: uid %s, %s=%q: want a mirror pod with the static pod's own uid in the annotation",
			ns, mirror, app.UID, kube.MirrorAnnotation, staticUID)
	}
	checkCapturedTraffic(t, s, client, app)
}
