package main

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/flagcheck/flagchecktest"
	"github.com/fleetstream/fleetstream/services/cluster-agent/hosted"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/xds"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	"github.com/fleetstream/fleetstream/services/kube-bridge/kubebridge"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// TestFlagsOfEveryService: fleetd takes every flag each service's binary registers through the
// service's RegisterFlags, with the same name, default and usage. Each binary's test
// (TestBinaryFlagsReachFleetd) checks its flags are those plus the daemon's and a listed few,
// so a flag added to a service and not to fleetd fails one of the two. Two services' flags of
// one name panic here (flag redefined) unless addFlags is told they are one setting.
func TestFlagsOfEveryService(t *testing.T) {
	var cfg fleetd.Config
	var logLevel string
	fd := newFlagSet(&cfg, &logLevel)
	services := []struct {
		name     string
		register func(*flag.FlagSet)
		// ownDefault: fleetd's default differs on purpose (it serves xDS by default).
		ownDefault bool
	}{
		{name: "cluster-import", register: new(clusterimport.Config).RegisterFlags},
		{name: "endpoint-collector", register: new(collector.Config).RegisterFlags},
		{name: "endpoint-collector xDS", register: func(fs *flag.FlagSet) { xds.RegisterListenFlag(fs, new(string), "") }, ownDefault: true},
		{name: "namespace-binding", register: new(namespacebinding.Config).RegisterFlags},
		{name: "rbac-sync", register: new(rbacsync.Config).RegisterFlags},
		{name: "cluster-agent --hosted", register: new(hosted.Config).RegisterFlags},
		{name: "kube-bridge", register: new(kubebridge.Config).RegisterFlags},
	}
	for _, s := range services {
		t.Run(s.name, func(t *testing.T) {
			fs := flag.NewFlagSet(s.name, flag.ContinueOnError)
			s.register(fs)
			n := 0
			fs.VisitAll(func(want *flag.Flag) {
				n++
				got := fd.Lookup(want.Name)
				switch {
				case got == nil:
					t.Errorf("fleetd has no --%s", want.Name)
				case got.Usage != want.Usage || got.DefValue != want.DefValue && !s.ownDefault:
					t.Errorf("fleetd's --%s = %q (%s), %s's = %q (%s)", want.Name, got.DefValue, got.Usage, s.name, want.DefValue, want.Usage)
				}
			})
			if n == 0 {
				t.Errorf("%s registers no flags", s.name)
			}
		})
	}
	// The flags the issue found missing.
	for _, name := range []string{"claim-grace", "policy-claim-grace", "stale-after", "evict-after", "weight-cleanup-after",
		"view-flush-interval", "no-view-writes", "workers", "response-cache-bytes",
		"in-cluster-grace", "heartbeat-interval", "endpointslices", "desired-workers"} {
		if fd.Lookup(name) == nil {
			t.Errorf("fleetd has no --%s", name)
		}
	}
}

// TestFlagsReachServices: a value given to fleetd reaches the service's config, and a flag two
// services share (one setting) reaches both once fleetd starts them.
func TestFlagsReachServices(t *testing.T) {
	var cfg fleetd.Config
	var logLevel string
	fs := newFlagSet(&cfg, &logLevel)
	err := fs.Parse([]string{"--data-dir=/d", "--claim-grace=3m", "--policy-claim-grace=4m", "--stale-after=5s",
		"--heartbeat-interval=7s", "--endpointslices=label=mesh", "--in-cluster-grace=9s",
		"--protected-namespaces=infra-*", "--credentials-allowed-proxies=proxy:3128", "--access-snapshots-kept=3"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"claim-grace", cfg.NamespaceBinding.ClaimGrace, 3 * time.Minute},
		{"policy-claim-grace", cfg.ClusterImport.PolicyClaimGrace, 4 * time.Minute},
		{"stale-after", cfg.Endpoints.StaleAfter, 5 * time.Second},
		{"heartbeat-interval", cfg.Hosted.Member.HeartbeatInterval, 7 * time.Second},
		{"endpointslices", cfg.Hosted.Member.EndpointSlices.String(), "label=mesh"},
		{"in-cluster-grace", cfg.Hosted.InClusterGrace, 9 * time.Second},
		{"protected-namespaces", cfg.NamespaceBinding.Protected.String(), "infra-*"},
		{"credentials-allowed-proxies", cfg.ClusterImport.Credentials.AllowedProxies, []string{"proxy:3128"}},
		{"access-snapshots-kept", cfg.RBAC.Snapshots.Keep, 3},
	} {
		if s, ok := c.want.([]string); ok {
			if !slices.Equal(c.got.([]string), s) {
				t.Errorf("--%s: got %v, want %v", c.name, c.got, c.want)
			}
		} else if c.got != c.want {
			t.Errorf("--%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

// TestValidateFlags: fleetd refuses a bad value of its own flags and of every service's before
// it starts anything, naming the flag.
func TestValidateFlags(t *testing.T) {
	flagchecktest.Run(t, func() *fleetdFlags { return new(fleetdFlags) }, []flagchecktest.Case{
		{Args: []string{"--data-dir="}, Want: "--data-dir is required"},
		{Args: []string{"--listen=8080"}, Want: `--listen "8080": want host:port`},
		{Args: []string{"--nats-listen=localhost:nats"}, Want: `--nats-listen "localhost:nats": port "nats"`},
		{Args: []string{"--xds-listen=:99999"}, Want: `--xds-listen ":99999": port "99999"`},
		{Args: []string{"--max-request-bytes=-1"}, Want: "--max-request-bytes -1: must not be negative"},
		{Args: []string{"--oidc-issuer-url=http://idp", "--oidc-client-id=x"}, Want: "--oidc-issuer-url"},
		{Args: []string{"--console-oidc-redirect-url=javascript:alert(1)//ui/"}, Want: "--console-oidc-redirect-url"},
		{Args: []string{"--console-oidc-redirect-url=https://fleet.example.com/"}, Want: "--console-oidc-redirect-url"},
		{Args: []string{"--console-oidc-scopes=openid gr\"oups"}, Want: "--console-oidc-scopes"},
		{Args: []string{"--claim-grace=-1s"}, Want: "--claim-grace -1s: must not be negative"},
		{Args: []string{"--placement-score-refresh=-1s"}, Want: "--placement-score-refresh -1s"},
		{Args: []string{"--policy-claim-grace=-2m"}, Want: "--policy-claim-grace -2m0s"},
		{Args: []string{"--unreachable-after=-1s"}, Want: "--unreachable-after -1s"},
		{Args: []string{"--max-agent-report-bytes-per-cluster=-5"}, Want: "--max-agent-report-bytes-per-cluster -5"},
		{Args: []string{"--credentials-allowed-proxies=https://p"}, Want: "--credentials-allowed-proxies"},
		{Args: []string{"--stale-after=-1s"}, Want: "--stale-after -1s"},
		{Args: []string{"--stale-after=2m", "--evict-after=1m"}, Want: "--evict-after must not be shorter than --stale-after"},
		{Args: []string{"--workers=-1"}, Want: "--workers -1"},
		{Args: []string{"--response-cache-bytes=-2"}, Want: "--response-cache-bytes"},
		{Args: []string{"--max-endpoints-per-cluster=-1"}, Want: "--max-endpoints-per-cluster -1"},
		{Args: []string{"--access-snapshot-max-age=-1h"}, Want: "--access-snapshot-max-age -1h0m0s"},
		{Args: []string{"--in-cluster-grace=-1s"}, Want: "--in-cluster-grace -1s"},
		{Args: []string{"--desired-resync=-1s"}, Want: "--desired-resync -1s"},
		// The hosted agents' flags count only with hosted agents.
		{Args: []string{"--hosted-agents=false", "--in-cluster-grace=-1s"}, Want: ""},
		{Args: nil, Want: ""},
	})
}

// fleetdFlags are fleetd's flags as flagchecktest takes them, with a data dir unless a case
// empties it.
type fleetdFlags struct {
	cfg      fleetd.Config
	logLevel string
}

func (f *fleetdFlags) RegisterFlags(fs *flag.FlagSet) {
	registerFlags(fs, &f.cfg, &f.logLevel)
	_ = fs.Set("data-dir", "/d")
}

func (f *fleetdFlags) Validate() error { return f.cfg.Validate() }

// TestRunRefusesBadFlags: a bad value exits 2 before anything starts (no data dir is made).
func TestRunRefusesBadFlags(t *testing.T) {
	dir := t.TempDir() + "/data"
	if code := run([]string{"--data-dir=" + dir, "--claim-grace=-1s", "--listen=127.0.0.1:0", "--nats-listen=127.0.0.1:0", "--xds-listen="}); code != 2 {
		t.Fatalf("run = %d, want 2", code)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the data dir was made (%v): fleetd started before checking its flags", err)
	}
}

// fleetd restore: usage errors exit 2; a directory that is no backup exits 1 and the data dir
// is not even created (the backup is verified before anything is touched).
func TestRestoreCommand(t *testing.T) {
	dir := t.TempDir() + "/data"
	for _, args := range [][]string{{"restore"}, {"restore", "--data-dir=" + dir}, {"restore", t.TempDir()}, {"restore", "--data-dir=" + dir, "a", "b"}} {
		if code := run(args); code != 2 {
			t.Errorf("fleetd %v = %d, want 2", args, code)
		}
	}
	if code := run([]string{"restore", "--data-dir=" + dir, t.TempDir()}); code != 1 {
		t.Errorf("restore of an empty directory = %d, want 1", code)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the data dir was made (%v) for a backup that is none", err)
	}
}
