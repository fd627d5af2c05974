package natsauth

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"
)

// CalloutQueue is the queue group of the responders: each request is answered by one replica.
const CalloutQueue = "fleetstream-auth-callout"

// Responder answers a NATS server's auth callout (`authorization { auth_callout { … } }`): the
// server sends every connecting client's CONNECT options on $SYS.REQ.USER.AUTH and admits the
// client only with a user JWT signed by the configured issuer, carrying its permissions.
type Responder struct {
	// Issuer signs the answers; its public key is the callout's `issuer` (an account nkey).
	Issuer nkeys.KeyPair
	// XKey, when set, decrypts requests and encrypts answers; its public key is the callout's
	// `xkey`. Without it requests (which carry the client's token) travel in clear inside the
	// NATS cluster, readable only by the callout's auth users.
	XKey nkeys.KeyPair
	// Account the admitted users are placed in (non-operator mode); "$G" when empty.
	Account string
	// ValidFor bounds a connection's authorization: when it ends the server closes the
	// connection and the client reconnects through the callout again, so a revoked token loses
	// its connections within ValidFor. 0 means one hour.
	ValidFor time.Duration
	// Resolve resolves a token to an identity; the table gives its permissions.
	Resolve Resolver
	Log     *zap.Logger
	// Concurrency bounds requests answered at once (a reconnect storm of agents); 0 means 32.
	Concurrency int
}

// Run answers requests on nc until ctx ends. nc must be one of the callout's auth_users (it
// bypasses the callout); nats.go resubscribes after a reconnect.
func (r *Responder) Run(ctx context.Context, nc *nats.Conn) error {
	if r.Issuer == nil || r.Resolve == nil {
		return errors.New("auth callout responder: issuer and resolver are required")
	}
	if r.Log == nil {
		r.Log = zap.NewNop()
	}
	n := r.Concurrency
	if n <= 0 {
		n = 32
	}
	slots := make(chan struct{}, n)
	sub, err := nc.QueueSubscribe(server.AuthCalloutSubject, CalloutQueue, func(m *nats.Msg) {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		go func() {
			defer func() { <-slots }()
			r.answer(ctx, m)
		}()
	})
	if err != nil {
		return fmt.Errorf("auth callout responder: subscribe %s: %w", server.AuthCalloutSubject, err)
	}
	// Make sure the server has the subscription now, not at the next buffered write: until it
	// does, every admission waits for nobody.
	if err := nc.Flush(); err != nil {
		r.Log.Warn("auth callout responder: flush subscription", zap.Error(err))
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	return nil
}

func (r *Responder) answer(ctx context.Context, m *nats.Msg) {
	data := m.Data
	serverXKey := ""
	if r.XKey != nil {
		serverXKey = m.Header.Get(server.AuthRequestXKeyHeader)
		if serverXKey == "" {
			r.Log.Warn("auth callout request not encrypted although an xkey is configured; ignored")
			return
		}
		var err error
		if data, err = r.XKey.Open(data, serverXKey); err != nil {
			r.Log.Warn("auth callout request cannot be decrypted; ignored", zap.Error(err))
			return
		}
	}
	req, err := jwt.DecodeAuthorizationRequestClaims(string(data))
	if err != nil {
		r.Log.Warn("malformed auth callout request; ignored", zap.Error(err))
		return
	}
	if !nkeys.IsValidPublicServerKey(req.Issuer) {
		r.Log.Warn("auth callout request not signed by a server; ignored", zap.String("issuer", req.Issuer))
		return
	}
	userJWT, refusal := r.authorize(ctx, req)
	resp := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	resp.Audience = req.Server.ID
	resp.Jwt = userJWT
	resp.Error = refusal
	signed, err := resp.Encode(r.Issuer)
	if err != nil {
		r.Log.Error("sign auth callout response", zap.Error(err))
		return
	}
	out := []byte(signed)
	if r.XKey != nil {
		if out, err = r.XKey.Seal(out, serverXKey); err != nil {
			r.Log.Error("encrypt auth callout response", zap.Error(err))
			return
		}
	}
	if err := m.Respond(out); err != nil {
		r.Log.Warn("answer auth callout", zap.Error(err))
	}
}

// authorize returns the signed user JWT of the connecting client, or why it is refused (sent to
// the server, which logs it; it never holds the token).
func (r *Responder) authorize(ctx context.Context, req *jwt.AuthorizationRequestClaims) (string, string) {
	remote := zap.String("remote", req.ClientInformation.Host)
	token := ConnectToken(req.ConnectOptions.Token, req.ConnectOptions.Password)
	if token == "" {
		r.Log.Info("nats connection refused: no token", remote)
		return "", "no token"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	id, ok := r.Resolve(ctx, req.ConnectOptions.Username, token)
	var perms Permissions
	if ok {
		perms, ok = id.Permissions()
	}
	if !ok {
		r.Log.Info("nats connection refused: unknown token", remote)
		return "", "unknown token"
	}
	uc := jwt.NewUserClaims(req.UserNkey)
	uc.Name = id.User()
	uc.Audience = r.Account
	if uc.Audience == "" {
		uc.Audience = server.DEFAULT_GLOBAL_ACCOUNT
	}
	uc.Permissions = perms.JWT()
	validFor := r.ValidFor
	if validFor <= 0 {
		validFor = time.Hour
	}
	uc.Expires = time.Now().Add(validFor).Unix()
	signed, err := uc.Encode(r.Issuer)
	if err != nil {
		r.Log.Error("sign user jwt", zap.Error(err))
		return "", "internal error"
	}
	r.Log.Debug("nats connection authorized", remote, zap.String("user", id.User()))
	return signed, ""
}

// LoadKeyFile reads an nkey seed (an account seed for the issuer, a curve seed for the xkey)
// from the first line of a file.
func LoadKeyFile(path string) (nkeys.KeyPair, error) {
	data, err := readFirstLine(path)
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed([]byte(data))
	if err != nil {
		return nil, fmt.Errorf("nkey seed in %s: %w", path, err)
	}
	return kp, nil
}
