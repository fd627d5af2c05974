// Package natsauth decides who may connect to NATS and what they may touch: one permission table
// (permissions.go) for every hub service, the agent of each cluster and each downstream
// subscriber, granted either by an in-process server.Authentication (fleetd's embedded server)
// or by the auth callout responder (callout.go) that any NATS cluster can delegate to.
package natsauth

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
)

// Kind is the kind of a NATS identity.
type Kind int

const (
	// KindService is a hub service, confined to what it uses (ServicePermissions).
	KindService Kind = iota + 1
	// KindAgent is the agent of one member cluster (AgentPermissions).
	KindAgent
	// KindSubscriber is a downstream system reading event streams (SubscriberPermissions).
	KindSubscriber
	// KindAdmin is the operator's identity for backups and restores (AdminPermissions).
	KindAdmin
)

func (k Kind) String() string {
	switch k {
	case KindService:
		return "service"
	case KindAgent:
		return "agent"
	case KindSubscriber:
		return "subscriber"
	case KindAdmin:
		return "admin"
	}
	return "unknown"
}

// Identity is who a token belongs to.
type Identity struct {
	Kind Kind
	// Name is the service, the cluster of the agent, or the subscriber.
	Name string
	// Streams a subscriber was given.
	Streams []string
	// Instance tells this identity from an earlier or later one of the same name: the id of the
	// agent's cluster (a name registered again is a new cluster), a prefix of the digest of the
	// subscriber's token. Empty for services, which are never revoked.
	Instance string
}

// User is the NATS user name the identity is known by (server logs, monitoring, and the key its
// connections are closed by when it is revoked, see Kicker): never the token. With the instance
// in it, closing a deregistered cluster's connections leaves alone those of a cluster
// registered since under the same name.
func (id Identity) User() string {
	u := id.Kind.String() + ":" + id.Name
	if id.Instance != "" {
		u += "@" + id.Instance
	}
	return u
}

// Permissions looks the identity up in the table; ok is false for an identity the table does
// not know (an unknown service), which must be refused.
func (id Identity) Permissions() (Permissions, bool) {
	switch id.Kind {
	case KindService:
		return ServicePermissions(id.Name)
	case KindAgent:
		return AgentPermissions(id.Name), id.Name != ""
	case KindSubscriber:
		return SubscriberPermissions(id.Name, id.Streams), id.Name != ""
	case KindAdmin:
		return AdminPermissions(), true
	}
	return Permissions{}, false
}

// Resolver returns whose token this is; ok false refuses the connection. user is the user name
// the client connected with: hub-hosted agents present the hosted-agent service's token with
// the user HostedAgentUser(cluster) (ResolveHostedAgent); other user names mean nothing.
type Resolver func(ctx context.Context, user, token string) (Identity, bool)

// hostedUserPrefix starts the NATS user name of a hub-hosted agent's connection.
const hostedUserPrefix = "hosted:"

// HostedAgentUser is the NATS user name a hub-hosted agent of cluster connects with, the
// hosted-agent service's token as its password.
func HostedAgentUser(cluster string) string { return hostedUserPrefix + cluster }

// IsHostedAgentUser reports whether a client connected with a hosted agent's user name.
func IsHostedAgentUser(user string) bool { return strings.HasPrefix(user, hostedUserPrefix) }

// ResolveHostedAgent turns the identity of a token into that of a hosted agent when user names
// one: only the hosted-agent service may, and it then gets exactly the permissions of that
// cluster's own agent (never its service permissions), for a cluster registered says exists
// (returning its id, the identity's instance). Other user names are ignored
// (`nats://user:token@host` URLs), as before hosted agents.
func ResolveHostedAgent(id Identity, user string, registered func(cluster string) (string, bool)) (Identity, bool) {
	if !IsHostedAgentUser(user) {
		return id, true
	}
	cluster := strings.TrimPrefix(user, hostedUserPrefix)
	if id.Kind != KindService || id.Name != ServiceHostedAgent || cluster == "" {
		return Identity{}, false
	}
	clusterID, ok := registered(cluster)
	if !ok {
		return Identity{}, false
	}
	return Identity{Kind: KindAgent, Name: cluster, Instance: clusterID}, true
}

// Authenticator implements server.Authentication for an embedded server.
type Authenticator struct {
	// FullAccessTokens get every permission: fleetd's in-process connection, which is every
	// service in one process.
	FullAccessTokens []string
	// AdminToken, when set, admits the operator's backup and restore identity (KindAdmin,
	// AdminPermissions): fleetd --nats-admin-token-file.
	AdminToken string
	// Resolve resolves every other token; nil admits nobody else.
	Resolve Resolver
	Log     *zap.Logger
}

var _ server.Authentication = (*Authenticator)(nil)

// Check admits a connection and registers the permissions it gets.
func (a *Authenticator) Check(c server.ClientAuthentication) bool {
	token := ConnectToken(c.GetOpts().Token, c.GetOpts().Password)
	if token == "" {
		return false
	}
	for _, t := range a.FullAccessTokens {
		if t != "" && subtle.ConstantTimeCompare(digest(t), digest(token)) == 1 {
			c.RegisterUser(&server.User{Username: "fleetd"})
			return true
		}
	}
	if a.AdminToken != "" && subtle.ConstantTimeCompare(digest(a.AdminToken), digest(token)) == 1 {
		admin := Identity{Kind: KindAdmin, Name: AdminUser}
		c.RegisterUser(&server.User{Username: admin.User(), Permissions: AdminPermissions().Server()})
		return true
	}
	if a.Resolve == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	id, ok := a.Resolve(ctx, c.GetOpts().Username, token)
	var perms Permissions
	if ok {
		perms, ok = id.Permissions()
	}
	if !ok {
		if a.Log != nil {
			a.Log.Warn("nats connection refused: unknown token", zap.Stringer("remote", c.RemoteAddress()))
		}
		return false
	}
	c.RegisterUser(&server.User{Username: id.User(), Permissions: perms.Server()})
	return true
}

// ConnectToken is the token a client presented: the token field, or the password of
// `nats://user:token@host` style URLs.
func ConnectToken(token, password string) string {
	if token != "" {
		return token
	}
	return password
}

func digest(s string) []byte {
	d := sha256.Sum256([]byte(s))
	return d[:]
}

// ServiceTokens maps hub services' NATS tokens to their names, compared by digest in constant
// time.
type ServiceTokens struct {
	entries []serviceToken
}

type serviceToken struct {
	digest  []byte
	service string
}

// NewServiceTokens returns the tokens of byService (service → token), for a process that makes
// its own (fleetd, for its in-process hosted agents).
func NewServiceTokens(byService map[string]string) (*ServiceTokens, error) {
	st := &ServiceTokens{}
	for service, token := range byService {
		if !slices.Contains(Services(), service) {
			return nil, fmt.Errorf("nats service tokens: unknown service %q", service)
		}
		if token == "" {
			return nil, fmt.Errorf("nats service tokens: empty token for %s", service)
		}
		st.entries = append(st.entries, serviceToken{digest: digest(token), service: service})
	}
	return st, nil
}

// LoadServiceTokens reads a file of `token,service` lines (blank lines and # comments allowed).
// Every service must be one the table knows: a typo must not silently grant nothing or,
// worse, be mistaken for another service.
func LoadServiceTokens(path string) (*ServiceTokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read nats service tokens: %w", err)
	}
	defer f.Close()
	st := &ServiceTokens{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		token, service, ok := strings.Cut(line, ",")
		token, service = strings.TrimSpace(token), strings.TrimSpace(service)
		if !ok || token == "" || service == "" {
			return nil, fmt.Errorf("nats service tokens %s line %d: want token,service", path, n)
		}
		if !slices.Contains(Services(), service) {
			return nil, fmt.Errorf("nats service tokens %s line %d: unknown service %q (one of %s)", path, n, service, strings.Join(Services(), ", "))
		}
		st.entries = append(st.entries, serviceToken{digest: digest(token), service: service})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read nats service tokens %s: %w", path, err)
	}
	return st, nil
}

// Lookup returns the service token belongs to. Every entry is compared, so the time taken does
// not tell which one matched.
func (st *ServiceTokens) Lookup(token string) (string, bool) {
	if st == nil || token == "" {
		return "", false
	}
	d := digest(token)
	found := ""
	for _, e := range st.entries {
		if subtle.ConstantTimeCompare(e.digest, d) == 1 {
			found = e.service
		}
	}
	return found, found != ""
}

func readFirstLine(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	line = strings.TrimSpace(line)
	if line == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return line, nil
}
