// Package chartrender gives tests outside test/chart the chart as a default install
// renders it: the reviewed render of a profile (test/chart/testdata/golden, which
// test/chart keeps equal to what helm renders), decoded, and its ServiceAccounts and
// RBAC applied to a test control plane. A test then runs the agent with exactly the
// grants the chart gives it, not a copy written by hand that can drift from it.
package chartrender

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/istio-cni/istio-cni/test/harness/repo"
)

// Namespace is the release namespace of the reviewed renders (test/chart renders
// into kube-system, as the default profile's install command does).
const Namespace = "kube-system"

// Render is a reviewed render's objects of kinds client-go knows.
type Render struct {
	Path    string
	Objects []runtime.Object
}

// Load reads the reviewed render of profile (default, gke, openshift) from the
// repository that holds the working directory.
func Load(profile string) (*Render, error) {
	root, err := repo.Root()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(root, "test", "chart", "testdata", "golden", profile+".yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the chart's render: %w", err)
	}
	r := &Render{Path: path}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	decode := scheme.Codecs.UniversalDeserializer().Decode
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return r, nil
		}
		if err != nil {
			return nil, fmt.Errorf("split %s: %w", path, err)
		}
		obj, _, err := decode(doc, nil, nil)
		switch {
		case err == nil:
			r.Objects = append(r.Objects, obj)
		case runtime.IsMissingKind(err), runtime.IsNotRegisteredError(err):
			// Only comments, or a kind outside client-go's scheme (NetworkAttachmentDefinition).
		default:
			return nil, fmt.Errorf("decode a document of %s: %w", path, err)
		}
	}
}

// DaemonSet is the render's DaemonSet of the agent.
func (r *Render) DaemonSet() (*appsv1.DaemonSet, error) {
	for _, o := range r.Objects {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			return ds, nil
		}
	}
	return nil, fmt.Errorf("%s has no DaemonSet", r.Path)
}

// ApplyRBAC creates the render's ServiceAccounts, Roles, RoleBindings, ClusterRoles
// and ClusterRoleBindings with client, and returns once the API server authorizes
// every rule bound to those ServiceAccounts (RBAC learns of new objects through a
// watch: a request made at once could still be refused).
func (r *Render) ApplyRBAC(ctx context.Context, client kubernetes.Interface) error {
	roles := map[string][]rbacv1.PolicyRule{} // "Role/ns/name", "ClusterRole//name"
	type grant struct {
		subject   rbacv1.Subject
		role      string
		namespace string // "" for a ClusterRoleBinding
	}
	var grants []grant
	for _, o := range r.Objects {
		var err error
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			_, err = client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			roles["Role/"+o.Namespace+"/"+o.Name] = o.Rules
			_, err = client.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			roles["ClusterRole//"+o.Name] = o.Rules
			_, err = client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			for _, s := range o.Subjects {
				ns := o.Namespace
				if o.RoleRef.Kind == "ClusterRole" {
					grants = append(grants, grant{s, "ClusterRole//" + o.RoleRef.Name, ns})
				} else {
					grants = append(grants, grant{s, "Role/" + ns + "/" + o.RoleRef.Name, ns})
				}
			}
			_, err = client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			for _, s := range o.Subjects {
				grants = append(grants, grant{s, "ClusterRole//" + o.RoleRef.Name, ""})
			}
			_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			continue
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %T from %s: %w", o, r.Path, err)
		}
	}
	for _, g := range grants {
		rules, ok := roles[g.role]
		if !ok {
			// Bound to a role the render does not hold (psp_cluster_role): not ours to wait for.
			continue
		}
		if g.subject.Kind != rbacv1.ServiceAccountKind {
			continue
		}
		if err := waitAuthorized(ctx, client, g.subject, g.namespace, rules); err != nil {
			return err
		}
	}
	return nil
}

// waitAuthorized polls SubjectAccessReviews until the first permission of every
// rule is granted to the ServiceAccount subject, in namespace ("": cluster-wide).
func waitAuthorized(ctx context.Context, client kubernetes.Interface, subject rbacv1.Subject, namespace string, rules []rbacv1.PolicyRule) error {
	user := "system:serviceaccount:" + subject.Namespace + ":" + subject.Name
	for _, rule := range rules {
		if len(rule.Verbs) == 0 || len(rule.APIGroups) == 0 || len(rule.Resources) == 0 {
			continue
		}
		attrs := &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: rule.Verbs[0], Group: rule.APIGroups[0], Resource: rule.Resources[0]}
		if res, sub, ok := strings.Cut(rule.Resources[0], "/"); ok {
			attrs.Resource, attrs.Subresource = res, sub
		}
		if len(rule.ResourceNames) > 0 {
			attrs.Name = rule.ResourceNames[0]
		}
		spec := authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: attrs,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + subject.Namespace, "system:authenticated"}}
		var last string
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			sar, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			last = sar.Status.Reason
			return sar.Status.Allowed, nil
		})
		if err != nil {
			return fmt.Errorf("wait for RBAC to grant %s %+v: %w (last reason: %q)", user, *attrs, err, last)
		}
	}
	return nil
}
