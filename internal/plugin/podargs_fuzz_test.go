package plugin

import (
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// k8sArgs is how Istio's plugin (and the other Kubernetes CNI plugins) read
// CNI_ARGS: libcni's types.LoadArgs into these fields.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
}

// FuzzParsePodArgsAgreesWithLoadArgs: CNI_ARGS that both ParsePodArgs and libcni's
// types.LoadArgs read (with IgnoreUnknown, as runtimes send it) name the same pod.
// ParsePodArgs is more lenient ("a=b=c", empty pairs, unknown keys without
// IgnoreUnknown): those LoadArgs refuses are not compared.
func FuzzParsePodArgsAgreesWithLoadArgs(f *testing.F) {
	for _, s := range []string{
		"IgnoreUnknown=1;K8S_POD_NAMESPACE=app;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1-2",
		"K8S_POD_NAME=a;K8S_POD_NAME=b", "", "K8S_POD_NAME=", "IgnoreUnknown=true;X=y=z",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParsePodArgs(s)
		if err != nil {
			return
		}
		var want k8sArgs
		if types.LoadArgs(s, &want) != nil {
			return
		}
		if got != (PodArgs{Name: string(want.K8S_POD_NAME), Namespace: string(want.K8S_POD_NAMESPACE),
			UID: string(want.K8S_POD_UID), InfraContainerID: string(want.K8S_POD_INFRA_CONTAINER_ID)}) {
			t.Fatalf("%q: ParsePodArgs reads %+v; LoadArgs reads %+v", s, got, want)
		}
	})
}
