// Package natsauth decides who may connect to an embedded NATS server and what they may touch:
// Fleetstream's own services get everything, a cluster agent only its own cluster's subjects.
package natsauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// AgentLookup returns the registered cluster an agent token belongs to.
type AgentLookup func(ctx context.Context, token string) (cluster string, ok bool)

// Authenticator implements server.Authentication.
type Authenticator struct {
	// ServiceTokens get full access (fleetd's in-process connection, services of the stack).
	ServiceTokens []string
	// Agents resolves agent tokens; nil admits no agents.
	Agents AgentLookup
	Log    *zap.Logger
}

var _ server.Authentication = (*Authenticator)(nil)

// Check admits a connection and registers the permissions it gets.
func (a *Authenticator) Check(c server.ClientAuthentication) bool {
	opts := c.GetOpts()
	token := opts.Token
	if token == "" {
		token = opts.Password // `nats://user:token@host` style URLs
	}
	if token == "" {
		return false
	}
	for _, t := range a.ServiceTokens {
		if t != "" && subtle.ConstantTimeCompare(digest(t), digest(token)) == 1 {
			c.RegisterUser(&server.User{Username: "service"})
			return true
		}
	}
	if a.Agents == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	cluster, ok := a.Agents(ctx, token)
	if !ok {
		if a.Log != nil {
			a.Log.Warn("nats connection refused: unknown token", zap.Stringer("remote", c.RemoteAddress()))
		}
		return false
	}
	c.RegisterUser(&server.User{Username: "agent:" + cluster, Permissions: AgentPermissions(cluster)})
	return true
}

func digest(s string) []byte {
	d := sha256.Sum256([]byte(s))
	return d[:]
}

// AgentInboxPrefix is the reply-subject prefix an agent of cluster must use
// (nats.CustomInboxPrefix): replies to it are all it may subscribe to besides its desired state.
func AgentInboxPrefix(cluster string) string { return "_INBOX_" + keys.Encode(cluster) }

// AgentPermissions allows an agent to publish its own reports and applied statuses and to read
// its own cluster's desired state, nothing else.
func AgentPermissions(cluster string) *server.Permissions {
	enc := keys.Encode(cluster)
	pub := []string{
		subjects.AgentPrefixFor(cluster) + ".>",
		"$JS.API.INFO",
		"$JS.FC.>",
		"$JS.API.STREAM.INFO.KV_" + subjects.AppliedBucket,
	}
	for _, b := range subjects.DesiredBuckets() {
		stream := "KV_" + b
		pub = append(pub,
			// An ordered consumer on the bucket filtered to this cluster's keys.
			"$JS.API.CONSUMER.CREATE."+stream+".*.$KV."+b+"."+enc+".>",
			"$JS.API.CONSUMER.DELETE."+stream+".*",
			"$JS.API.CONSUMER.INFO."+stream+".*",
			"$JS.API.STREAM.INFO."+stream,
			"$JS.ACK."+stream+".>",
			// Its statuses for this bucket's keys: written, and read back (direct get of the
			// last value) so that an unchanged status is not written again after a restart.
			"$KV."+subjects.AppliedBucket+"."+keys.Encode(b)+"."+enc+".>",
			"$JS.API.DIRECT.GET.KV_"+subjects.AppliedBucket+".$KV."+subjects.AppliedBucket+"."+keys.Encode(b)+"."+enc+".>",
		)
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub},
		Subscribe: &server.SubjectPermission{Allow: []string{AgentInboxPrefix(cluster) + ".>"}},
	}
}
