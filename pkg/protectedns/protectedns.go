// Package protectedns names the namespaces of a member cluster that never belong to a project:
// the cluster's own (kube-system, kube-public, kube-node-lease, default) and Fleetstream's
// (the hub's and the agent's). A project that owned one would reach beyond its namespaces:
// kube-system's Secrets and ServiceAccounts are the cluster's control plane, and the agent's
// namespace holds the ServiceAccount that writes RBAC on the cluster.
//
// The hub's API refuses to bind one (namespace-binding) and every agent refuses again to
// adopt, label, quota or bind in one (cluster-agent's desired applier): an agent does not
// trust the hub with its own cluster. Both read the list from --protected-namespaces, which adds
// to the defaults; the defaults cannot be removed.
package protectedns

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// defaults are protected on every cluster whatever the configuration says. A trailing `*`
// matches every name that starts with what precedes it. fleetstream and fleetstream-agent are
// where the README installs the hub and the agent; an agent installed elsewhere adds its own
// namespace (the chart passes it).
var defaults = [...]string{"kube-*", "default", "fleetstream", "fleetstream-agent"}

// Defaults returns the patterns every List protects.
func Defaults() []string { return slices.Clone(defaults[:]) }

// List is a set of protected namespace patterns: the defaults plus those added to it. The zero List
// protects the defaults, so a component whose configuration forgot the list is still safe.
type List struct {
	extra []string
}

// New returns the defaults plus extra, which must be valid patterns (see Validate).
func New(extra ...string) (List, error) {
	var l List
	for _, p := range extra {
		if err := l.add(p); err != nil {
			return List{}, err
		}
	}
	return l, nil
}

// Validate checks a pattern: a namespace name (an RFC 1123 label), or the start of one followed
// by a single trailing `*`.
func Validate(pattern string) error {
	name, prefix := strings.CutSuffix(pattern, "*")
	if prefix {
		if name == "" {
			return fmt.Errorf("protected namespace %q: a prefix must precede the *", pattern)
		}
		// A prefix is a valid label once completed; checking it completed with "x" accepts
		// "team-" but still refuses "Team" or "a*b".
		name += "x"
	}
	if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
		return fmt.Errorf("protected namespace %q: %s", pattern, strings.Join(msgs, "; "))
	}
	return nil
}

func (l *List) add(pattern string) error {
	pattern = strings.TrimSpace(pattern)
	if pattern == "" {
		return nil
	}
	if err := Validate(pattern); err != nil {
		return err
	}
	if !slices.Contains(defaults[:], pattern) && !slices.Contains(l.extra, pattern) {
		l.extra = append(l.extra, pattern)
	}
	return nil
}

// Patterns returns every pattern of the list, the defaults first.
func (l List) Patterns() []string {
	return append(Defaults(), l.extra...)
}

// Match returns the pattern that protects namespace, if one does.
func (l List) Match(namespace string) (pattern string, ok bool) {
	for _, ps := range [][]string{defaults[:], l.extra} {
		for _, p := range ps {
			if matches(p, namespace) {
				return p, true
			}
		}
	}
	return "", false
}

// Reason says that namespace is protected, and by which pattern, for errors and reports; empty
// when it is not protected.
func (l List) Reason(namespace string) string {
	p, ok := l.Match(namespace)
	switch {
	case !ok:
		return ""
	case p == namespace:
		return fmt.Sprintf("%q is protected", namespace)
	}
	return fmt.Sprintf("%q is protected (%s)", namespace, p)
}

func matches(pattern, namespace string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(namespace, prefix)
	}
	return pattern == namespace
}

// String lists the patterns added to the defaults, comma-separated (flag.Value).
func (l *List) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(l.extra, ",")
}

// Set adds comma-separated patterns (flag.Value); the flag may be repeated.
func (l *List) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if err := l.add(p); err != nil {
			return err
		}
	}
	return nil
}

// RegisterFlags adds --protected-namespaces, which adds patterns to l.
func (l *List) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(l, "protected-namespaces", "comma-separated namespaces that are never a project's, added to the defaults "+
		strings.Join(defaults[:], ", ")+" (which always apply); a trailing * matches a prefix, e.g. infra-*")
}
