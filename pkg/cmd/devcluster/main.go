// Command devcluster prepares the member clusters of the local compose stack (docker-compose.yml:
// an etcd and a kube-apiserver per member, and an agent running as if in-cluster). DEV ONLY.
//
//	devcluster init --dir DIR --name NAME --host-port PORT
//	    once per member: the apiserver's serving certificate (valid for the in-stack names, for
//	    the in-cluster names and for 127.0.0.1), its service-account signing key, a static token
//	    file with one admin token (group system:masters, for bootstrap and the demo only), an
//	    admin kubeconfig for the host, and the agent's in-cluster files (ca.crt, namespace).
//	    Existing files are kept, so a restarted stack keeps trusting them.
//	devcluster init --dir DIR --name hub --host-port PORT --kube-bridge
//	    the same for the kube bridge's hub, plus a second static token, of the user
//	    fleetstream-kube-bridge (no group), and kube-bridge.kubeconfig, that user's connection
//	    from inside the stack (https://<name>-apiserver:6443).
//	devcluster bootstrap-hub --dir DIR --rules FILE
//	    once the hub's apiserver answers: the ClusterRole fleetstream-kube-bridge with the rules
//	    the hub chart includes (deploy/helm/fleetstream/files/kube-bridge-clusterrole-rules.yaml),
//	    bound to the user fleetstream-kube-bridge: the bridge acts with exactly those rights.
//	devcluster bootstrap --dir DIR --rules FILE
//	    once the apiserver answers: applies the agent's least-privilege identity exactly as the
//	    cluster-agent chart does (its namespace, ServiceAccount, the ClusterRole with the rules
//	    the chart includes, and its binding) and writes a token of that ServiceAccount, issued by
//	    the apiserver (TokenRequest, as `kubectl create token` does), where the agent container
//	    reads it as its in-cluster token.
//
// The layout under DIR is:
//
//	pki/             mounted into the apiserver: serving.crt, serving.key, sa.key, tokens.csv
//	admin.kubeconfig the host's admin connection (https://127.0.0.1:PORT)
//	serviceaccount/  mounted into the agent at /var/run/secrets/kubernetes.io/serviceaccount
//	agent/           mounted into the agent at /run/secrets/nats: its NATS token (the register step)
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The agent's identity, as the cluster-agent chart names it with its default values (release
// fleetstream in namespace fleetstream-agent).
const (
	agentNamespace = "fleetstream-agent"
	agentSA        = "fleetstream-cluster-agent"
	agentRole      = "fleetstream-cluster-agent"
	adminUser      = "fleetstream-admin"
	// The kube bridge's user on the compose hub, and its ClusterRole (the hub chart's name).
	bridgeUser   = "fleetstream-kube-bridge"
	bridgeRole   = "fleetstream-kube-bridge"
	fieldManager = "fleetstream-devcluster"
	// A dev stack lives for days, not hours; the agent rereads the file, so a restart of
	// bootstrap renews it.
	agentTokenTTL = 365 * 24 * time.Hour
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "devcluster:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: devcluster init|bootstrap|bootstrap-hub [flags]")
	}
	fs := flag.NewFlagSet("devcluster "+args[0], flag.ContinueOnError)
	dir := fs.String("dir", "", "the member's directory (required)")
	switch args[0] {
	case "init":
		name := fs.String("name", "", "the member's name; its apiserver container is <name>-apiserver (required)")
		port := fs.Int("host-port", 0, "the apiserver's port published on 127.0.0.1 (required)")
		bridge := fs.Bool("kube-bridge", false, "the kube bridge's hub: also a token and an in-stack kubeconfig of the user "+bridgeUser)
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *dir == "" || *name == "" || *port <= 0 {
			return errors.New("init: --dir, --name and --host-port are required")
		}
		if err := initMember(*dir, *name, *port); err != nil {
			return err
		}
		if *bridge {
			return initBridge(*dir, *name)
		}
		return nil
	case "bootstrap-hub":
		rules := fs.String("rules", "", "the kube bridge's ClusterRole rules (deploy/helm/fleetstream/files/kube-bridge-clusterrole-rules.yaml; required)")
		timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for the apiserver")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *dir == "" || *rules == "" {
			return errors.New("bootstrap-hub: --dir and --rules are required")
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		return bootstrapHub(ctx, *dir, *rules)
	case "bootstrap":
		rules := fs.String("rules", "", "the agent's ClusterRole rules (deploy/helm/cluster-agent/files/clusterrole-rules.yaml; required)")
		timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for the apiserver")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *dir == "" || *rules == "" {
			return errors.New("bootstrap: --dir and --rules are required")
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		return bootstrap(ctx, *dir, *rules)
	default:
		return fmt.Errorf("unknown command %q: want init, bootstrap or bootstrap-hub", args[0])
	}
}

// initMember writes what is missing of the member's files; it never replaces one.
func initMember(dir, name string, hostPort int) error {
	pki := filepath.Join(dir, "pki")
	sa := filepath.Join(dir, "serviceaccount")
	agent := filepath.Join(dir, "agent")
	for _, d := range []string{pki, sa, agent} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		// The containers run as uid 65532 and must traverse the mounted directories.
		if err := os.Chmod(d, 0o755); err != nil {
			return err
		}
	}
	certFile, keyFile := filepath.Join(pki, "serving.crt"), filepath.Join(pki, "serving.key")
	if !exists(certFile) || !exists(keyFile) {
		certPEM, keyPEM, err := servingCert(name)
		if err != nil {
			return fmt.Errorf("serving certificate: %w", err)
		}
		if err := writeFile(keyFile, keyPEM); err != nil {
			return err
		}
		if err := writeFile(certFile, certPEM); err != nil {
			return err
		}
	}
	if saKey := filepath.Join(pki, "sa.key"); !exists(saKey) {
		// The apiserver accepts one RSA private key as both the signing and the verification key.
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return err
		}
		if err := writeFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})); err != nil {
			return err
		}
	}
	tokens := filepath.Join(pki, "tokens.csv")
	if !exists(tokens) {
		tok := make([]byte, 32)
		if _, err := rand.Read(tok); err != nil {
			return err
		}
		line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", hex.EncodeToString(tok), adminUser, adminUser)
		if err := writeFile(tokens, []byte(line)); err != nil {
			return err
		}
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return err
	}
	adminToken, err := readAdminToken(tokens)
	if err != nil {
		return err
	}
	kubeconfig, err := clientcmd.Write(clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{name: {Server: "https://127.0.0.1:" + strconv.Itoa(hostPort), CertificateAuthorityData: certPEM}},
		// Named after the member, so the members' kubeconfigs merge (KUBECONFIG=a:b) into one
		// with a context per member.
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{name + "-admin": {Token: adminToken}},
		Contexts:       map[string]*clientcmdapi.Context{name: {Cluster: name, AuthInfo: name + "-admin"}},
		CurrentContext: name,
	})
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "admin.kubeconfig"), kubeconfig, 0o600); err != nil {
		return err
	}
	// What the kubelet would mount into the agent's pod (the token comes with bootstrap).
	if err := writeFile(filepath.Join(sa, "ca.crt"), certPEM); err != nil {
		return err
	}
	return writeFile(filepath.Join(sa, "namespace"), []byte(agentNamespace))
}

// servingCert returns a self-signed certificate, its own CA, for every name the apiserver is
// reached by: its container's name in the stack, the in-cluster names and the host's loopback.
func servingCert(name string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name + "-apiserver"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(5 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames: []string{name + "-apiserver", "localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// openAdmin connects with dir's admin kubeconfig once the apiserver answers.
func openAdmin(ctx context.Context, dir string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		return nil, fmt.Errorf("admin kubeconfig: %w", err)
	}
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, admin); err != nil {
		return nil, fmt.Errorf("apiserver %s: %w", cfg.Host, err)
	}
	return admin, nil
}

// bootstrap gives the agent its chart identity and writes the agent's token.
func bootstrap(ctx context.Context, dir, rulesFile string) error {
	rules, err := readRules(rulesFile)
	if err != nil {
		return err
	}
	admin, err := openAdmin(ctx, dir)
	if err != nil {
		return err
	}
	apply := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
	if _, err := admin.CoreV1().Namespaces().Apply(ctx, corev1ac.Namespace(agentNamespace), apply); err != nil {
		return fmt.Errorf("namespace %s: %w", agentNamespace, err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(agentNamespace).Apply(ctx, corev1ac.ServiceAccount(agentSA, agentNamespace), apply); err != nil {
		return fmt.Errorf("serviceaccount %s: %w", agentSA, err)
	}
	role := rbacv1ac.ClusterRole(agentRole)
	for _, r := range rules {
		role.WithRules(rbacv1ac.PolicyRule().WithAPIGroups(r.APIGroups...).WithResources(r.Resources...).
			WithVerbs(r.Verbs...).WithResourceNames(r.ResourceNames...).WithNonResourceURLs(r.NonResourceURLs...))
	}
	if _, err := admin.RbacV1().ClusterRoles().Apply(ctx, role, apply); err != nil {
		return fmt.Errorf("clusterrole %s: %w", agentRole, err)
	}
	binding := rbacv1ac.ClusterRoleBinding(agentRole).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(agentRole)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(agentSA).WithNamespace(agentNamespace))
	if _, err := admin.RbacV1().ClusterRoleBindings().Apply(ctx, binding, apply); err != nil {
		return fmt.Errorf("clusterrolebinding %s: %w", agentRole, err)
	}
	ttl := int64(agentTokenTTL / time.Second)
	tr, err := admin.CoreV1().ServiceAccounts(agentNamespace).CreateToken(ctx, agentSA,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token of serviceaccount %s/%s: %w", agentNamespace, agentSA, err)
	}
	// Written by rename into the mounted directory, so a running agent never reads half a token.
	if err := writeFile(filepath.Join(dir, "serviceaccount", "token"), []byte(tr.Status.Token)); err != nil {
		return err
	}
	fmt.Printf("    %s: ServiceAccount %s/%s bound to ClusterRole %s (%d rules), token valid until %s\n",
		filepath.Base(dir), agentNamespace, agentSA, agentRole, len(rules), tr.Status.ExpirationTimestamp.UTC().Format(time.RFC3339))
	return nil
}

// initBridge adds the kube bridge's static token to the hub's token file (once) and writes its
// kubeconfig for the bridge's container.
func initBridge(dir, name string) error {
	tokens := filepath.Join(dir, "pki", "tokens.csv")
	data, err := os.ReadFile(tokens)
	if err != nil {
		return err
	}
	token := ""
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if f := strings.Split(line, ","); len(f) >= 2 && f[1] == bridgeUser {
			token = f[0]
		}
	}
	if token == "" {
		tok := make([]byte, 32)
		if _, err := rand.Read(tok); err != nil {
			return err
		}
		token = hex.EncodeToString(tok)
		// No group: the user has the ClusterRole bootstrap-hub binds, nothing else.
		data = append(data, fmt.Sprintf("%s,%s,%s\n", token, bridgeUser, bridgeUser)...)
		if err := writeFile(tokens, data); err != nil {
			return err
		}
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, "pki", "serving.crt"))
	if err != nil {
		return err
	}
	kubeconfig, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{name: {Server: "https://" + name + "-apiserver:6443", CertificateAuthorityData: certPEM}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{bridgeUser: {Token: token}},
		Contexts:       map[string]*clientcmdapi.Context{name: {Cluster: name, AuthInfo: bridgeUser}},
		CurrentContext: name,
	})
	if err != nil {
		return fmt.Errorf("kube bridge kubeconfig: %w", err)
	}
	return writeFile(filepath.Join(dir, "kube-bridge.kubeconfig"), kubeconfig)
}

// bootstrapHub binds the kube bridge's user to its ClusterRole on the hub.
func bootstrapHub(ctx context.Context, dir, rulesFile string) error {
	rules, err := readRules(rulesFile)
	if err != nil {
		return err
	}
	admin, err := openAdmin(ctx, dir)
	if err != nil {
		return err
	}
	apply := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
	role := rbacv1ac.ClusterRole(bridgeRole)
	for _, r := range rules {
		role.WithRules(rbacv1ac.PolicyRule().WithAPIGroups(r.APIGroups...).WithResources(r.Resources...).
			WithVerbs(r.Verbs...).WithResourceNames(r.ResourceNames...).WithNonResourceURLs(r.NonResourceURLs...))
	}
	if _, err := admin.RbacV1().ClusterRoles().Apply(ctx, role, apply); err != nil {
		return fmt.Errorf("clusterrole %s: %w", bridgeRole, err)
	}
	binding := rbacv1ac.ClusterRoleBinding(bridgeRole).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(bridgeRole)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.UserKind).WithAPIGroup(rbacv1.GroupName).WithName(bridgeUser))
	if _, err := admin.RbacV1().ClusterRoleBindings().Apply(ctx, binding, apply); err != nil {
		return fmt.Errorf("clusterrolebinding %s: %w", bridgeRole, err)
	}
	fmt.Printf("    %s: user %s bound to ClusterRole %s (%d rules)\n", filepath.Base(dir), bridgeUser, bridgeRole, len(rules))
	return nil
}

// readRules reads the chart's rules file: a YAML list of PolicyRules.
func readRules(path string) ([]rbacv1.PolicyRule, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("agent rules: %w", err)
	}
	defer f.Close()
	var rules []rbacv1.PolicyRule
	if err := yaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&rules); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("%s holds no rules", path)
	}
	return rules, nil
}

// waitReady polls /readyz until it answers ok or ctx ends.
func waitReady(ctx context.Context, admin kubernetes.Interface) error {
	var last error
	for {
		body, err := admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("/readyz: %q", body)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func readAdminToken(tokensFile string) (string, error) {
	data, err := os.ReadFile(tokensFile)
	if err != nil {
		return "", err
	}
	for i, c := range data {
		if c == ',' {
			return string(data[:i]), nil
		}
	}
	return "", fmt.Errorf("%s: no token", tokensFile)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// writeFile replaces path atomically. The files are world-readable because the containers run
// as uid 65532; the member directories live under .data/compose, which only the owner may enter.
func writeFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
