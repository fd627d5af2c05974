package testkit_test

import (
	"errors"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

func TestStartKube(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	k := testkit.StartKube(t)
	ctx := testkit.Context(t, time.Minute)

	ns, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	if ns.Status.Phase != corev1.NamespaceActive {
		t.Errorf("phase = %q, want Active", ns.Status.Phase)
	}

	// The kubeconfig must describe the same admin connection.
	cfg, err := clientcmd.RESTConfigFromKubeConfig(k.Kubeconfig)
	if err != nil {
		t.Fatalf("parse kubeconfig: %v", err)
	}
	if cfg.Host != k.Config.Host {
		t.Errorf("kubeconfig host = %q, want %q", cfg.Host, k.Config.Host)
	}

	// Give alice read access to pods in team-a only, then ask RBAC about alice and bob, who has
	// nothing: the `kubectl auth can-i --as` check.
	_, err = k.Client.RbacV1().Roles("team-a").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create role: %v", err)
	}
	_, err = k.Client.RbacV1().RoleBindings("team-a").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-pod-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-reader"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create role binding: %v", err)
	}
	// The apiserver's RBAC authorizer reads roles and bindings through informers: wait until it
	// has the new binding before asking about it.
	testkit.Eventually(t, 10*time.Second, func() error {
		sar, err := k.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: "alice",
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "team-a", Verb: "list", Resource: "pods"}},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if !sar.Status.Allowed {
			return errors.New("the binding is not in effect yet")
		}
		return nil
	})

	tests := []struct {
		name      string
		user      string
		verb      string
		namespace string
		want      bool
	}{
		{"no permissions", "bob", "list", "team-a", false},
		{"bound verb", "alice", "list", "team-a", true},
		{"unbound verb", "alice", "delete", "team-a", false},
		{"other namespace", "alice", "list", "default", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sar, err := k.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User: tc.user,
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Namespace: tc.namespace, Verb: tc.verb, Resource: "pods",
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("subject access review: %v", err)
			}
			if sar.Status.Allowed != tc.want {
				t.Errorf("allowed = %v (%s), want %v", sar.Status.Allowed, sar.Status.Reason, tc.want)
			}
		})
	}

	// Impersonation enforces the same decision on real requests.
	_, err = k.ClientAs(t, "bob").CoreV1().Pods("team-a").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("bob lists pods: err = %v, want Forbidden", err)
	}
	if _, err := k.ClientAs(t, "alice").CoreV1().Pods("team-a").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("alice lists pods: %v", err)
	}
}

// TestStartKubeSeveral checks that member clusters run side by side, isolated from each other.
func TestStartKubeSeveral(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	ctx := testkit.Context(t, time.Minute)
	a, b := testkit.StartKube(t), testkit.StartKube(t)
	if _, err := a.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "only-in-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	if _, err := b.Client.CoreV1().Namespaces().Get(ctx, "only-in-a", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("get in b: err = %v, want NotFound", err)
	}
}
