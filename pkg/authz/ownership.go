package authz

import (
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
)

// Ownership facts for services that merge what several clusters report (endpoint-collector):
// read from the same namespace-bindings mirror that decides Namespace scopes, so what a
// service merges and who may read or weight it can never disagree for longer than one view
// update.

// NamespaceBindings returns the bindings of namespace on every cluster where a project owns it
// (namespace-binding's view as this authorizer mirrors it). The messages are shared: callers
// must not modify them.
func (a *Authorizer) NamespaceBindings(namespace string) []*projectv1.NamespaceBinding {
	return a.namespaces.lookup(nsTerm(namespace))
}

// NamespaceBindingsChanged returns a channel closed at the next change of the namespace
// bindings (another copy of the view installed included).
func (a *Authorizer) NamespaceBindingsChanged() <-chan struct{} {
	chs := a.namespaces.changed()
	if len(chs) == 1 {
		return chs[0]
	}
	out := make(chan struct{})
	go func() {
		defer close(out)
		select {
		case <-chs[0]:
		case <-chs[1]:
		}
	}()
	return out
}

// CanInOwningProject reports whether the caller may do verb on resource of group in at least
// one project owning namespace on some cluster, and which: the projects whose view of the
// namespace's services it reads (docs/endpoints.md, "Who owns a service's endpoints"). A
// platform admin may everywhere; a namespace no project owns is the platform's.
func (c *Caller) CanInOwningProject(verb, group, resource, namespace string) []string {
	if c == nil {
		return nil
	}
	var out []string
	for _, p := range c.a.owners("", namespace) {
		if c.Can(verb, group, resource, p) {
			out = append(out, p)
		}
	}
	return out
}
