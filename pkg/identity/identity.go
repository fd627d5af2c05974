// Package identity carries who is calling through a context: the authenticated API caller
// (user and groups), recorded by the server's authentication and read by authorization and by
// the event store, which attributes every event to its actor.
package identity

import "context"

type actorKey struct{}

// WithActor returns ctx carrying the identity events appended under it are attributed to.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// ActorFrom returns the actor carried by ctx, or "" if none.
func ActorFrom(ctx context.Context) string {
	a, _ := ctx.Value(actorKey{}).(string)
	return a
}

type groupsKey struct{}

// WithGroups returns ctx carrying the groups the actor belongs to, which authorization counts
// alongside the actor itself.
func WithGroups(ctx context.Context, groups []string) context.Context {
	return context.WithValue(ctx, groupsKey{}, groups)
}

// GroupsFrom returns the actor's groups carried by ctx.
func GroupsFrom(ctx context.Context) []string {
	g, _ := ctx.Value(groupsKey{}).([]string)
	return g
}
