package desired

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"

	"github.com/fleetstream/fleetstream/pkg/keys"
)

// knownKinds are the kinds Fleetstream's services put into desired state. Their informers run
// from the start, so drift and prune work for them even before the first desired object of the
// kind shows up, and a tombstone's bare kind token resolves to them.
func knownKinds() []schema.GroupVersionKind {
	return []schema.GroupVersionKind{
		{Version: "v1", Kind: "Namespace"},
		{Version: "v1", Kind: "ResourceQuota"},
		{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"},
		{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"},
	}
}

// tokenKinds are the kinds a bare kind token may name besides knownKinds.
func tokenKinds() []schema.GroupKind {
	return []schema.GroupKind{
		{Group: "rbac.authorization.k8s.io", Kind: "Role"},
		{Group: "rbac.authorization.k8s.io", Kind: "ClusterRoleBinding"},
	}
}

// resolver maps kinds to resources through discovery, cached, refreshed when a kind is unknown
// (a CRD installed after start).
type resolver struct {
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newResolver(disc discovery.DiscoveryInterface) *resolver {
	return &resolver{mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

// mapping returns the REST mapping of gk (at version if not empty).
func (r *resolver) mapping(gk schema.GroupKind, version string) (*meta.RESTMapping, error) {
	var versions []string
	if version != "" {
		versions = []string{version}
	}
	m, err := r.mapper.RESTMapping(gk, versions...)
	if meta.IsNoMatchError(err) {
		r.mapper.Reset()
		m, err = r.mapper.RESTMapping(gk, versions...)
	}
	if err != nil {
		return nil, fmt.Errorf("map kind %s: %w", gk, err)
	}
	return m, nil
}

// keyTarget is the object a desired key names.
type keyTarget struct {
	kind      schema.GroupKind
	namespace string
	name      string
}

// parseDesiredKey splits `<cluster>.<kind>.<namespace>.<name>`. The kind token is a Kind,
// optionally qualified with its group (`Kind.group`, encoded into one token); a bare Kind is
// looked up among knownKinds and otherwise taken as a core kind. The key is what a tombstone
// has to go by, since its manifest is empty.
func parseDesiredKey(key string) (keyTarget, error) {
	toks, err := keys.Split(key)
	if err != nil {
		return keyTarget{}, fmt.Errorf("desired key %q: %w", key, err)
	}
	if len(toks) != 4 || toks[1] == "" || toks[3] == "" {
		return keyTarget{}, fmt.Errorf("desired key %q: want <cluster>.<kind>.<namespace>.<name>", key)
	}
	return keyTarget{kind: kindFromToken(toks[1]), namespace: toks[2], name: toks[3]}, nil
}

func kindFromToken(tok string) schema.GroupKind {
	if strings.Contains(tok, ".") {
		return schema.ParseGroupKind(tok)
	}
	for _, k := range knownKinds() {
		if strings.EqualFold(k.Kind, tok) {
			return k.GroupKind()
		}
	}
	for _, gk := range tokenKinds() {
		if strings.EqualFold(gk.Kind, tok) {
			return gk
		}
	}
	return schema.GroupKind{Kind: tok}
}
