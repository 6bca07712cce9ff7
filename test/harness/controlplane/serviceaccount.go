package controlplane

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TokenLifetime is how long tokens from ServiceAccountKubeconfig are valid: long
// enough for a developer session on hack/controlplane.sh, not forever.
const TokenLifetime = 24 * time.Hour

// EnsureNamespace creates the namespace if it is missing, and its "default"
// ServiceAccount, which the ServiceAccount admission plugin requires before it
// admits a pod there and which only kube-controller-manager would otherwise create.
func (c *ControlPlane) EnsureNamespace(ctx context.Context, namespace string) error {
	_, err := c.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: namespace},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	return c.ensureServiceAccount(ctx, namespace, "default")
}

func (c *ControlPlane) ensureServiceAccount(ctx context.Context, namespace, name string) error {
	_, err := c.admin.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service account %s/%s: %w", namespace, name, err)
	}
	return nil
}

// ServiceAccountKubeconfig gives the ServiceAccount namespace/name exactly rules
// (through a ClusterRole and ClusterRoleBinding, both named
// "controlplane:NAMESPACE:NAME"), requests a token for it from the TokenRequest API,
// and writes a kubeconfig with that token and the CA. The namespace and the
// ServiceAccount are created if missing; calling it again replaces the rules and
// issues a fresh token. It returns once the apiserver authorizes the new rules,
// so a caller never races RBAC's propagation.
func (c *ControlPlane) ServiceAccountKubeconfig(ctx context.Context, namespace, name string, rules []rbacv1.PolicyRule) (path string, err error) {
	if err := c.EnsureNamespace(ctx, namespace); err != nil {
		return "", err
	}
	if err := c.ensureServiceAccount(ctx, namespace, name); err != nil {
		return "", err
	}
	if err := c.bindRules(ctx, namespace, name, rules); err != nil {
		return "", err
	}
	lifetime := int64(TokenLifetime / time.Second)
	tr, err := c.admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &lifetime},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("request token for service account %s/%s: %w", namespace, name, err)
	}
	if err := c.waitAuthorized(ctx, namespace, name, rules); err != nil {
		return "", err
	}
	path = filepath.Join(c.dir, "kubeconfigs", fmt.Sprintf("sa-%s-%s.kubeconfig", namespace, name))
	return writeKubeconfig(path, c.host, c.caData, "system:serviceaccount:"+namespace+":"+name, authInfo{token: tr.Status.Token})
}

func (c *ControlPlane) bindRules(ctx context.Context, namespace, name string, rules []rbacv1.PolicyRule) error {
	roleName := "controlplane:" + namespace + ":" + name
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: roleName}, Rules: rules}
	roles := c.admin.RbacV1().ClusterRoles()
	if _, err := roles.Create(ctx, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		existing, err := roles.Get(ctx, roleName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get cluster role %s: %w", roleName, err)
		}
		existing.Rules = rules
		if _, err := roles.Update(ctx, existing, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update cluster role %s: %w", roleName, err)
		}
	} else if err != nil {
		return fmt.Errorf("create cluster role %s: %w", roleName, err)
	}

	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: roleName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roleName},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}},
	}
	// An existing binding has the same role and subject by construction of its name.
	if _, err := c.admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create cluster role binding %s: %w", roleName, err)
	}
	return nil
}

// waitAuthorized asks the apiserver (SubjectAccessReview, the authorizer's own
// view) whether the first permission of every rule is granted yet: the RBAC
// authorizer learns of new roles through a watch, so a request made right after
// the binding was created could still be refused.
func (c *ControlPlane) waitAuthorized(ctx context.Context, namespace, name string, rules []rbacv1.PolicyRule) error {
	user := "system:serviceaccount:" + namespace + ":" + name
	for _, rule := range rules {
		spec := authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		}
		if len(rule.Verbs) == 0 {
			continue
		}
		switch {
		case len(rule.NonResourceURLs) > 0:
			spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: rule.NonResourceURLs[0], Verb: rule.Verbs[0]}
		case len(rule.Resources) > 0 && len(rule.APIGroups) > 0:
			ra := &authorizationv1.ResourceAttributes{Verb: rule.Verbs[0], Group: rule.APIGroups[0], Resource: rule.Resources[0]}
			if len(rule.ResourceNames) > 0 {
				ra.Name = rule.ResourceNames[0]
			}
			spec.ResourceAttributes = ra
		default:
			continue
		}
		var last string
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			sar, err := c.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			last = sar.Status.Reason
			return sar.Status.Allowed, nil
		})
		if err != nil {
			return fmt.Errorf("wait for rbac to grant %s %+v: %w (last reason: %q)", user, rule, err, last)
		}
	}
	return nil
}
