package testkit

import (
	"bytes"
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
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Kube is a running member cluster for tests: a real etcd and kube-apiserver with RBAC, no
// kubelets and no controller-manager (so, for example, a deleted namespace stays Terminating
// until its finalizer is removed through the finalize subresource).
type Kube struct {
	// Config is an admin (group system:masters) connection.
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// Kubeconfig is the admin connection as a kubeconfig file's contents; KubeconfigPath is that
	// file on disk, for kubectl or a binary under test.
	Kubeconfig     []byte
	KubeconfigPath string
	// Dir holds the cluster's certificates, data and process logs.
	Dir string
}

// kubeAdminUser is the token-authenticated user every Kube's admin config uses.
const kubeAdminUser = "fleetstream-admin"

// StartKube starts etcd and kube-apiserver on free loopback ports in a temporary directory and
// stops both when the test ends. Several may run at once.
//
// The binaries come from $KUBEBUILDER_ASSETS if set, else from tools/build-test-assets.sh at the
// repository root (the directory holding go.work), which builds them once into a cache.
func StartKube(t testing.TB) *Kube {
	t.Helper()
	assets, err := kubeAssets()
	if err != nil {
		t.Fatalf("locate kube test assets: %v", err)
	}
	dir := t.TempDir()
	// Starting can lose a race for a port another process grabbed after we probed it; such a
	// failure is worth a couple of retries, anything else fails on every attempt alike.
	var k *Kube
	for attempt := 1; ; attempt++ {
		k, err = startKube(t, assets, filepath.Join(dir, strconv.Itoa(attempt)))
		if err == nil {
			return k
		}
		if attempt == 3 {
			t.Fatalf("start kube-apiserver: %v", err)
		}
		t.Logf("start kube-apiserver (attempt %d): %v; retrying", attempt, err)
	}
}

// ConfigAs returns a copy of the admin config impersonating user in groups, for checking what
// RBAC lets that user do.
func (k *Kube) ConfigAs(user string, groups ...string) *rest.Config {
	c := rest.CopyConfig(k.Config)
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return c
}

// ClientAs returns a clientset impersonating user in groups.
func (k *Kube) ClientAs(t testing.TB, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(k.ConfigAs(user, groups...))
	if err != nil {
		t.Fatalf("clientset as %s: %v", user, err)
	}
	return c
}

func startKube(t testing.TB, assets, dir string) (*Kube, error) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]

	files, err := writeKubeFiles(dir)
	if err != nil {
		return nil, err
	}

	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	etcd, err := startProcess(t, dir, "etcd", filepath.Join(assets, "etcd"),
		"--name=default",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		// Test data is disposable; fsync only makes a shared machine slower.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	)
	if err != nil {
		return nil, err
	}

	api, err := startProcess(t, dir, "kube-apiserver", filepath.Join(assets, "kube-apiserver"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(apiPort),
		"--cert-dir="+filepath.Join(dir, "certs"),
		"--tls-cert-file="+files.servingCert,
		"--tls-private-key-file="+files.servingKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+files.saKey,
		"--service-account-signing-key-file="+files.saKey,
		"--token-auth-file="+files.tokens,
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--allow-privileged=true",
		// Without kubelets, pods never need a ServiceAccount token; without a controller
		// manager nobody would create the default ServiceAccount the plugin insists on.
		"--disable-admission-plugins=ServiceAccount",
		"--v=0",
	)
	if err != nil {
		etcd.stop()
		return nil, err
	}

	host := "https://127.0.0.1:" + strconv.Itoa(apiPort)
	cfg := &rest.Config{
		Host:            host,
		BearerToken:     files.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: files.servingCertPEM},
		// Tests create objects in bursts; client-side throttling would only slow them down.
		QPS:   1000,
		Burst: 2000,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := waitReady(ctx, cfg, api, etcd); err != nil {
		api.stop()
		etcd.stop()
		return nil, fmt.Errorf("%w\n--- etcd log tail:\n%s\n--- kube-apiserver log tail:\n%s", err, etcd.tail(), api.tail())
	}
	// Stop in reverse order: an apiserver that outlives its etcd logs connection errors forever.
	t.Cleanup(etcd.stop)
	t.Cleanup(api.stop)

	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("clientset: %w", err)
	}
	kubeconfig, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"test": {Server: host, CertificateAuthorityData: files.servingCertPEM}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"admin": {Token: files.adminToken}},
		Contexts:       map[string]*clientcmdapi.Context{"test": {Cluster: "test", AuthInfo: "admin"}},
		CurrentContext: "test",
	})
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	return &Kube{Config: cfg, Client: client, Kubeconfig: kubeconfig, KubeconfigPath: kubeconfigPath, Dir: dir}, nil
}

// waitReady polls /readyz until it answers ok, a process exits, or ctx ends.
func waitReady(ctx context.Context, cfg *rest.Config, procs ...*process) error {
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return fmt.Errorf("transport: %w", err)
	}
	hc := &http.Client{Transport: rt, Timeout: 2 * time.Second}
	var last error
	for {
		for _, p := range procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited before the apiserver was ready: %v", p.name, p.err)
			default:
			}
		}
		resp, err := hc.Get(cfg.Host + "/readyz")
		if err == nil {
			body := new(bytes.Buffer)
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("readyz %d: %s", resp.StatusCode, strings.TrimSpace(body.String()))
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("apiserver not ready: %w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// process is a child process whose output goes to a log file.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startProcess(t testing.TB, dir, name, bin string, args ...string) (*process, error) {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// stop asks the process to terminate and kills it if it takes too long.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tail returns the end of the process's log, for a failure message.
func (p *process) tail() string {
	b, _ := os.ReadFile(p.log)
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

type kubeFiles struct {
	servingCert, servingKey string
	servingCertPEM          []byte
	saKey                   string
	tokens                  string
	adminToken              string
}

// writeKubeFiles writes a serving certificate for 127.0.0.1, a service-account signing key and a
// token file with one admin in system:masters.
func writeKubeFiles(dir string) (kubeFiles, error) {
	var f kubeFiles
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		// Self-signed and its own CA, so clients can trust exactly this certificate.
		IsCA:        true,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:    []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return f, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return f, err
	}
	f.servingCertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	f.servingCert = filepath.Join(dir, "serving.crt")
	f.servingKey = filepath.Join(dir, "serving.key")
	if err := os.WriteFile(f.servingCert, f.servingCertPEM, 0o600); err != nil {
		return f, err
	}
	if err := os.WriteFile(f.servingKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return f, err
	}

	// The apiserver accepts one RSA private key as both the signing key and the verification key.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return f, err
	}
	f.saKey = filepath.Join(dir, "sa.key")
	if err := os.WriteFile(f.saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}), 0o600); err != nil {
		return f, err
	}

	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return f, err
	}
	f.adminToken = hex.EncodeToString(tok)
	f.tokens = filepath.Join(dir, "tokens.csv")
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", f.adminToken, kubeAdminUser, kubeAdminUser)
	if err := os.WriteFile(f.tokens, []byte(line), 0o600); err != nil {
		return f, err
	}
	return f, nil
}

// freePorts returns n distinct loopback ports that were free a moment ago. All listeners are held
// until every port is chosen so the same port is not returned twice.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// kubeAssets returns the directory holding kube-apiserver and etcd.
func kubeAssets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "tools", "build-test-assets.sh")
	cmd := exec.Command(script)
	cmd.Dir = root
	// The tools modules are deliberately outside go.work (their dependency graphs are huge).
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w\n%s", script, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("%s printed %q: %w", script, dir, err)
		}
	}
	return dir, nil
}

// repoRoot walks up from the working directory (a test runs in its package's directory) to the
// directory holding go.work.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work above the working directory")
		}
		dir = parent
	}
}
