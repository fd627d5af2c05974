package natsauth_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap/zaptest"

	"github.com/fleetstream/fleetstream/pkg/backup"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

var update = flag.Bool("update", false, "rewrite deploy/nats/auth.conf from the permission table")

const authConf = "../../deploy/nats/auth.conf"

// renderAuthConf renders the compose NATS cluster's authorization block: cluster-import's static
// user (it answers the callout, so it cannot go through it) with cluster-import's permissions
// from the table plus the responder's, and the callout delegating everyone else.
func renderAuthConf() string {
	p := natsauth.Merge(must(natsauth.ServicePermissions(natsauth.ServiceClusterImport)), natsauth.CalloutResponderPermissions())
	sys := natsauth.SystemPermissions()
	admin := natsauth.AdminPermissions()
	list := func(subjects []string) string {
		var b strings.Builder
		for _, s := range subjects {
			fmt.Fprintf(&b, "            %q\n", s)
		}
		return b.String()
	}
	return `# GENERATED from the permission table in pkg/natsauth/permissions.go by
#   cd pkg && go test ./natsauth -run TestDeployAuthConf -update
# Edit the table, not this file (the test fails when they differ).
#
# The authorization of the compose stack's NATS cluster, included by nats-{1,2,3}.conf. Every
# client but cluster-import is admitted by the auth callout, which cluster-import answers: hub
# services with their own tokens and permissions, agents of registered clusters, subscribers.
# The secrets are read from the environment (.data/compose/nats.env, made by
# tools/scripts/dev-secrets.sh); production injects its own.
authorization {
  # Seconds a client has to be authorized, the callout's answer included.
  timeout: 5
  users: [
    {
      user: cluster-import
      password: $NATS_CALLOUT_PASSWORD
      permissions: {
        publish: {
          allow: [
` + list(p.Publish) + `          ]
        }
        subscribe: {
          allow: [
` + list(p.Subscribe) + `          ]
        }
      }
    }
    # The operator's backups and restores (fleetctl admin backup/restore --nats-user
    # ` + natsauth.AdminUser + `): JetStream's API and snapshots, no stream's subjects. Static, as
    # a restore runs before cluster-import answers the callout.
    {
      user: ` + natsauth.AdminUser + `
      password: $NATS_ADMIN_PASSWORD
      permissions: {
        publish: {
          allow: [
` + list(admin.Publish) + `          ]
        }
        subscribe: {
          allow: [
` + list(admin.Subscribe) + `          ]
        }
      }
    }
  ]
  auth_callout {
    # Public account nkey whose seed signs the answers (cluster-import --nats-callout-issuer-seed-file).
    issuer: $NATS_CALLOUT_ISSUER
    # Public curve key: requests (which carry tokens) and answers are encrypted.
    xkey: $NATS_CALLOUT_XKEY
    auth_users: [ cluster-import, ` + natsauth.SystemUser + `, ` + natsauth.AdminUser + ` ]
  }
}

# The system account, with one user: cluster-import (--nats-system-user, same password) closes a
# revoked agent's or subscriber's open connections on every server with it. It may only list
# connections and close them.
system_account: SYS
accounts {
  SYS {
    users: [
      {
        user: ` + natsauth.SystemUser + `
        password: $NATS_CALLOUT_PASSWORD
        permissions: {
          publish: {
            allow: [
` + indent(list(sys.Publish)) + `            ]
          }
          subscribe: {
            allow: [
` + indent(list(sys.Subscribe)) + `            ]
          }
        }
      }
    ]
  }
}
`
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n  ") + "\n"
}

func must(p natsauth.Permissions, ok bool) natsauth.Permissions {
	if !ok {
		panic("unknown service")
	}
	return p
}

// The deployed file is the table's, and a server configured with it works: cluster-import's
// restricted user answers the callout (encrypted) and an agent is admitted and confined.
func TestDeployAuthConf(t *testing.T) {
	want := renderAuthConf()
	if *update {
		if err := os.WriteFile(authConf, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(authConf)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s differs from the permission table; regenerate it with -update", authConf)
	}

	issuer, _ := nkeys.CreateAccount()
	issuerPub, _ := issuer.PublicKey()
	xkey, _ := nkeys.CreateCurveKeys()
	xkeyPub, _ := xkey.PublicKey()
	t.Setenv("NATS_CALLOUT_PASSWORD", "pw-for-test")
	t.Setenv("NATS_ADMIN_PASSWORD", "admin-pw-for-test")
	t.Setenv("NATS_CALLOUT_ISSUER", issuerPub)
	t.Setenv("NATS_CALLOUT_XKEY", xkeyPub)
	dir := t.TempDir()
	conf := filepath.Join(dir, "nats.conf")
	// As in compose: the file sits next to the server's config, which includes it.
	if err := os.WriteFile(filepath.Join(dir, "auth.conf"), got, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("listen: 127.0.0.1:-1\njetstream { store_dir: %q }\ninclude auth.conf\n", dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if opts.AuthCallout == nil || opts.AuthCallout.Issuer != issuerPub || opts.AuthCallout.XKey != xkeyPub ||
		!slices.Equal(opts.AuthCallout.AuthUsers, []string{natsauth.ServiceClusterImport, natsauth.SystemUser, natsauth.AdminUser}) {
		t.Fatalf("auth_callout parsed as %+v", opts.AuthCallout)
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("not ready")
	}
	url := fmt.Sprintf("nats://%s", s.Addr().(*net.TCPAddr).String())
	rc, err := nats.Connect(url, nats.UserInfo(natsauth.ServiceClusterImport, "pw-for-test"),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.ServiceClusterImport)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var revoked atomic.Bool
	r := &natsauth.Responder{Issuer: issuer, XKey: xkey, Log: zaptest.NewLogger(t),
		Resolve: func(_ context.Context, _, token string) (natsauth.Identity, bool) {
			return natsauth.Identity{Kind: natsauth.KindAgent, Name: "c1"}, token == "agent-c1" && !revoked.Load()
		}}
	go func() { done <- r.Run(ctx, rc) }()
	t.Cleanup(func() { cancel(); <-done })

	// The responder subscribes in its own goroutine: until the server has that subscription an
	// admission waits for nobody and times out, so the first agent retries.
	var c *client
	testkit.Eventually(t, 15*time.Second, func() error {
		c, err = connect(t, url, "agent-c1", natsauth.AgentInboxPrefix("c1"))
		if err != nil {
			return fmt.Errorf("agent through the deployed callout: %w", err)
		}
		return nil
	})
	c.denied(t, "fleet.>", func(context.Context) error {
		sub, err := c.nc.SubscribeSync("fleet.>")
		if err != nil {
			return err
		}
		_, err = sub.NextMsg(300 * time.Millisecond)
		return err
	})
	if _, err := connect(t, url, "wrong", ""); err == nil {
		t.Fatal("wrong token admitted")
	}
	// cluster-import's own user may not write what other services own.
	rcErrs := make(chan error, 8)
	rc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { rcErrs <- err })
	own := &client{nc: rc, errs: rcErrs}
	own.denied(t, "$KV."+subjects.DesiredRBACBucket, func(context.Context) error {
		if err := rc.Publish("$KV."+subjects.DesiredRBACBucket+".c1.x", []byte("x")); err != nil {
			return err
		}
		if err := rc.Flush(); err != nil {
			return err
		}
		return errors.New("published") // no answer: the server's violation report is the verdict
	})

	// The system account user closes the agent's connection (a revocation), and can do
	// nothing else.
	sysnc, err := nats.Connect(url, nats.UserInfo(natsauth.SystemUser, "pw-for-test"), nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.SystemUser)))
	if err != nil {
		t.Fatalf("system user: %v", err)
	}
	t.Cleanup(sysnc.Close)
	revoked.Store(true)
	kctx, kcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer kcancel()
	if n, err := (&natsauth.SystemKicker{Conn: sysnc}).Kick(kctx, natsauth.Identity{Kind: natsauth.KindAgent, Name: "c1"}.User()); err != nil || n != 1 {
		t.Fatalf("kick the agent: %d closed, %v; want 1", n, err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if c.nc.IsConnected() {
			return errors.New("the kicked agent is still connected")
		}
		return nil
	})
	if _, err := sysnc.Request("$SYS.REQ.SERVER.PING.VARZ", nil, time.Second); err == nil {
		t.Error("the system user may ask for more than connections")
	}

	// The admin user backs every stream up and restores it, through the deployed permissions,
	// and may not touch a stream's subjects.
	if _, err := rc.Request("$JS.API.STREAM.CREATE.FLEET_CLUSTER",
		[]byte(`{"name":"FLEET_CLUSTER","subjects":["fleet.cluster.>"],"storage":"file"}`), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.Request("fleet.cluster.c1", []byte("registered"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	adminErrs := make(chan error, 8)
	adminnc, err := nats.Connect(url, nats.UserInfo(natsauth.AdminUser, "admin-pw-for-test"),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.AdminUser)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { adminErrs <- err }))
	if err != nil {
		t.Fatalf("admin user: %v", err)
	}
	t.Cleanup(adminnc.Close)
	bctx, bcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer bcancel()
	bdir := filepath.Join(t.TempDir(), "backup")
	m, err := backup.Backup(bctx, adminnc, bdir, backup.Options{Version: "dev"})
	if err != nil || len(m.Streams) != 1 || m.Streams[0].Msgs != 1 {
		t.Fatalf("backup as the admin user: %v %+v", err, m)
	}
	if _, err := backup.Restore(bctx, adminnc, bdir, backup.RestoreOptions{Options: backup.Options{Version: "dev"}, Force: true}); err != nil {
		t.Fatalf("restore as the admin user: %v", err)
	}
	admin := &client{nc: adminnc, errs: adminErrs}
	admin.denied(t, "fleet.cluster.c1", func(context.Context) error {
		if err := adminnc.Publish("fleet.cluster.c1", []byte("x")); err != nil {
			return err
		}
		if err := adminnc.Flush(); err != nil {
			return err
		}
		return errors.New("published")
	})
}
