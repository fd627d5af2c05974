//go:build composecheck

package natsauth_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// TestComposeIsolation is tools/scripts/compose-check.sh's proof on the running three-node
// cluster of docker-compose.yml, whose auth callout cluster-import answers:
//
//	FLEETSTREAM_COMPOSE_NATS_URL           nats://127.0.0.1:14222
//	FLEETSTREAM_COMPOSE_AGENT_TOKEN        the agent token of cluster c1 (from RegisterCluster)
//	FLEETSTREAM_COMPOSE_SERVICE_TOKEN_FILE namespace-binding's NATS token
func TestComposeIsolation(t *testing.T) {
	url, agentToken := os.Getenv("FLEETSTREAM_COMPOSE_NATS_URL"), os.Getenv("FLEETSTREAM_COMPOSE_AGENT_TOKEN")
	if url == "" || agentToken == "" {
		t.Fatal("FLEETSTREAM_COMPOSE_NATS_URL and FLEETSTREAM_COMPOSE_AGENT_TOKEN are required")
	}
	watchDenied := func(c *client, bucket, filter string) {
		t.Helper()
		c.denied(t, "KV_"+bucket, func(ctx context.Context) error {
			kv, err := c.js.KeyValue(ctx, bucket)
			if err != nil {
				return err
			}
			w, err := kv.Watch(ctx, filter)
			if err == nil {
				_ = w.Stop()
			}
			return err
		})
	}

	t.Run("wrong token refused", func(t *testing.T) {
		if _, err := connect(t, url, "fsa_not-a-token", natsauth.AgentInboxPrefix("c1")); err == nil ||
			!strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Fatalf("wrong token: %v, want an authorization violation", err)
		}
	})

	t.Run("agent of c1", func(t *testing.T) {
		c, err := connect(t, url, agentToken, natsauth.AgentInboxPrefix("c1"))
		allowed(t, "agent c1 connects", err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Its own desired state is readable (so the denials below are about c2, not the bucket).
		for _, b := range subjects.DesiredBuckets() {
			kv, err := c.js.KeyValue(ctx, b)
			allowed(t, "open "+b, err)
			w, err := kv.Watch(ctx, "c1.>")
			allowed(t, "watch own keys of "+b, err)
			_ = w.Stop()
		}
		for _, b := range subjects.DesiredBuckets() {
			watchDenied(c, b, "c2.>")
			c.denied(t, "$JS.API.DIRECT.GET.KV_"+b, func(ctx context.Context) error {
				_, err := c.nc.Request("$JS.API.DIRECT.GET.KV_"+b+".$KV."+b+".c2.>", nil, time.Second)
				return err
			})
		}
		c.denied(t, "fleet.>", func(context.Context) error {
			sub, err := c.nc.SubscribeSync("fleet.>")
			if err != nil {
				return err
			}
			_, err = sub.NextMsg(time.Second)
			return err
		})
		c.denied(t, "KV_"+subjects.ClusterCredentialsBucket, func(ctx context.Context) error {
			_, err := c.js.KeyValue(ctx, subjects.ClusterCredentialsBucket)
			return err
		})
		c.denied(t, "$JS.API.DIRECT.GET.KV_"+subjects.ClusterCredentialsBucket, func(context.Context) error {
			_, err := c.nc.Request("$JS.API.DIRECT.GET.KV_"+subjects.ClusterCredentialsBucket+".$KV."+subjects.ClusterCredentialsBucket+".>", nil, time.Second)
			return err
		})
	})

	t.Run("namespace-binding", func(t *testing.T) {
		path := os.Getenv("FLEETSTREAM_COMPOSE_SERVICE_TOKEN_FILE")
		if path == "" {
			t.Skip("no FLEETSTREAM_COMPOSE_SERVICE_TOKEN_FILE")
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		c, err := connect(t, url, strings.TrimSpace(string(data)), natsauth.ServiceInboxPrefix(natsauth.ServiceNamespaceBinding))
		allowed(t, "namespace-binding connects", err)
		c.denied(t, "$KV."+subjects.DesiredRBACBucket, func(ctx context.Context) error {
			_, err := c.js.Publish(ctx, "$KV."+subjects.DesiredRBACBucket+".c1.ClusterRole.=.forged", []byte("x"))
			return err
		})
		c.denied(t, "KV_"+subjects.ClusterCredentialsBucket, func(ctx context.Context) error {
			_, err := c.js.KeyValue(ctx, subjects.ClusterCredentialsBucket)
			return err
		})
	})
}
