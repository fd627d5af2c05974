package authz

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/identity"
)

// startWait bounds how long a call waits for the authorizer's mirrors to load at start-up.
const startWait = 10 * time.Second

// Interceptor returns the Connect interceptor enforcing the table. It must run inside the
// authentication interceptor, which records the caller (identity.WithActor, identity.WithGroups).
func (a *Authorizer) Interceptor() connect.Interceptor { return interceptor{a} }

type interceptor struct{ a *Authorizer }

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		c, err := i.a.caller(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := i.a.decideFresh(ctx, c, req.Spec().Procedure, req.Any()); err != nil {
			return nil, err
		}
		return next(withCaller(ctx, c), req)
	}
}

func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		c, err := i.a.caller(ctx)
		if err != nil {
			return err
		}
		return next(withCaller(ctx, c), &authorizedConn{StreamingHandlerConn: conn, ctx: ctx, a: i.a, c: c})
	}
}

// authorizedConn decides once the request message has arrived (the scope depends on it), and
// decides again before every message it sends, so a watch stops at the first change after the
// caller loses its right rather than running on until the client hangs up.
type authorizedConn struct {
	connect.StreamingHandlerConn
	ctx   context.Context
	a     *Authorizer
	c     *Caller
	msg   any
	authd bool
}

func (s *authorizedConn) Receive(m any) error {
	if err := s.StreamingHandlerConn.Receive(m); err != nil {
		return err
	}
	if _, err := s.a.decideFresh(s.ctx, s.c, s.Spec().Procedure, m); err != nil {
		return err
	}
	s.msg, s.authd = m, true
	return nil
}

func (s *authorizedConn) Send(m any) error {
	if !s.authd {
		return apierr.PermissionDenied("nothing is sent before the request is authorized")
	}
	if sc, err := s.a.decide(s.c, s.Spec().Procedure, s.msg); err != nil {
		s.a.recordDenial(s.c, s.Spec().Procedure, sc, err)
		return err
	}
	return s.StreamingHandlerConn.Send(m)
}

// caller builds the Caller of an authenticated call.
func (a *Authorizer) caller(ctx context.Context) (*Caller, error) {
	user := identity.ActorFrom(ctx)
	if user == "" {
		return nil, apierr.Unauthenticated(errors.New("no authenticated caller"))
	}
	select {
	case <-a.ready:
	default:
		t := time.NewTimer(startWait)
		defer t.Stop()
		select {
		case <-a.ready:
		case <-ctx.Done():
			return nil, apierr.Starting("authorization")
		case <-t.C:
			return nil, apierr.Starting("authorization")
		}
	}
	return a.CallerFor(user, identity.GroupsFrom(ctx)), nil
}

// CallerFor returns the authorization view of user and its groups, for checks outside a
// Connect call (a gRPC stream of another protocol, say), which must apply the same rules.
func (a *Authorizer) CallerFor(user string, groups []string) *Caller {
	return &Caller{a: a, user: user, groups: groups, admin: a.isAdmin(user, groups), xdsReader: a.isXDSReader(user, groups)}
}

// Authorize applies the table to a call that is not a Connect call (the xDS server's gRPC
// streams): the caller authenticated into ctx (server.Authenticator), the procedure as
// /package.Service/Method and its request message (nil when the rule's scope does not depend
// on it). The error is a *connect.Error, whose codes are gRPC's.
func (a *Authorizer) Authorize(ctx context.Context, procedure string, msg any) (*Caller, error) {
	c, err := a.caller(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := a.decideFresh(ctx, c, procedure, msg); err != nil {
		return nil, err
	}
	return c, nil
}

// decideFresh is decide, except that a denial that may rest on views this process has not yet
// caught up with is decided again once it has.
func (a *Authorizer) decideFresh(ctx context.Context, c *Caller, procedure string, msg any) (Scope, error) {
	s, err := a.decide(c, procedure, msg)
	if err != nil && (s.Kind == Project || s.Kind == Namespace || s.Kind == NamespaceView || s.Kind == ClusterSet || s.Kind == ClusterMember) {
		a.catchUp(ctx)
		s, err = a.decide(c, procedure, msg)
	}
	if err != nil {
		a.recordDenial(c, procedure, s, err)
	}
	return s, err
}

// DenialRecorder records denied calls as audit activity (pkg/audit). RecordDenial must not
// block: it runs on the call's path.
type DenialRecorder interface {
	RecordDenial(user, procedure, resource, project, cluster, reason string)
}

// RecordDenials makes every denial the authorizer decides from now on go to r as well. Call it
// before serving.
func (a *Authorizer) RecordDenials(r DenialRecorder) { a.denials = r }

func (a *Authorizer) recordDenial(c *Caller, procedure string, s Scope, err error) {
	if a.denials == nil {
		return
	}
	reason := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		reason = ce.Message()
	}
	resource := ""
	if rule, ok := table[procedure]; ok {
		resource = rule.Resource
	}
	a.denials.RecordDenial(c.User(), procedure, resource, s.Project, s.Cluster, reason)
}

// decide applies the procedure's rule to one request.
func (a *Authorizer) decide(c *Caller, procedure string, msg any) (Scope, error) {
	rule, ok := table[procedure]
	if !ok {
		if c.Admin() {
			return Scope{Kind: Platform}, nil
		}
		return Scope{}, apierr.PermissionDenied("user %q may not call %s: it has no authorization rule, so only platform admins may", c.user, procedure)
	}
	s := rule.ScopeOf(msg)
	var allowed bool
	switch s.Kind {
	case Authenticated, Filtered:
		allowed = true
	case Project:
		allowed = c.Can(rule.Verb, rule.Group, rule.Resource, s.Project)
	case Namespace:
		allowed = c.CanInNamespace(rule.Verb, rule.Group, rule.Resource, s.Cluster, s.Namespace)
	case NamespaceView:
		allowed = c.Admin() || len(c.CanInOwningProject(rule.Verb, rule.Group, rule.Resource, s.Namespace)) > 0
	case ClusterSet:
		allowed = c.Admin() || c.CanInClusterSet(rule.Verb, rule.Group, rule.Resource, s.ClusterSet) &&
			(s.Also == nil || c.Can(s.Also.Verb, s.Also.Group, s.Also.Resource, s.Project))
	case ClusterMember:
		if c.Admin() {
			allowed = true
		} else {
			s.detail = c.decideClusterUpdate(rule.Verb, rule.Group, rule.Resource, s.update)
			allowed = s.detail == ""
		}
	case XDSReaders:
		allowed = c.Admin() || c.xdsReader
	default:
		allowed = c.Admin()
	}
	if !allowed {
		return s, Denied(c, rule.Verb, rule.resourceName(), s)
	}
	return s, nil
}

// Denied is the PermissionDenied error naming who may not do what where.
func Denied(c *Caller, verb, resource string, s Scope) error {
	return apierr.PermissionDenied("user %q may not %s %s %s", c.User(), verb, resource, s)
}
