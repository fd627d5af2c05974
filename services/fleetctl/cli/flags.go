package cli

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"unicode"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
)

// parseKeyValues parses repeated k=v flag values into a map. Only the shape is checked here;
// the server validates keys and values against the Kubernetes label rules and reports the exact
// field, which is more useful than a second, drifting copy of those rules in the client.
func parseKeyValues(flag string, values []string) (map[string]string, error) {
	out := make(map[string]string, len(values))
	for _, kv := range values {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want key=value", flag, kv)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("--%s: key %q given twice", flag, k)
		}
		out[k] = v
	}
	return out, nil
}

// parseTaints parses repeated key[=value]:Effect flag values, the syntax of kubectl taint.
func parseTaints(values []string) ([]*clusterv1.Taint, error) {
	out := make([]*clusterv1.Taint, 0, len(values))
	seen := map[string]bool{}
	for _, s := range values {
		kv, effectName, ok := cutLast(s, ":")
		if !ok || effectName == "" {
			return nil, fmt.Errorf("--taint %q: want key=value:Effect (Effect one of %s)", s, strings.Join(taintEffectNames(), ", "))
		}
		effect, ok := parseTaintEffect(effectName)
		if !ok {
			return nil, fmt.Errorf("--taint %q: unknown effect %q, want one of %s", s, effectName, strings.Join(taintEffectNames(), ", "))
		}
		k, v, _ := strings.Cut(kv, "=")
		if k == "" {
			return nil, fmt.Errorf("--taint %q: empty key", s)
		}
		// Kubernetes identifies a taint by key and effect; the server keeps the same rule.
		id := k + ":" + effect.String()
		if seen[id] {
			return nil, fmt.Errorf("--taint: %s:%s given twice", k, effectName)
		}
		seen[id] = true
		out = append(out, &clusterv1.Taint{Key: k, Value: v, Effect: effect})
	}
	return out, nil
}

// cutLast is strings.Cut at the last occurrence of sep, since the effect is always the part
// after the last ':'.
func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// taintEffectName turns TAINT_EFFECT_NO_SELECT_IF_NEW into NoSelectIfNew, the spelling users
// type, derived from the enum so new effects need no change here.
func taintEffectName(e clusterv1.TaintEffect) string {
	name := strings.TrimPrefix(e.String(), "TAINT_EFFECT_")
	var b strings.Builder
	for _, word := range strings.Split(name, "_") {
		if word == "" {
			continue
		}
		r := []rune(strings.ToLower(word))
		r[0] = unicode.ToUpper(r[0])
		b.WriteString(string(r))
	}
	return b.String()
}

func parseTaintEffect(s string) (clusterv1.TaintEffect, bool) {
	for v := range clusterv1.TaintEffect_name {
		e := clusterv1.TaintEffect(v)
		if e == clusterv1.TaintEffect_TAINT_EFFECT_UNSPECIFIED {
			continue
		}
		if strings.EqualFold(s, taintEffectName(e)) || strings.EqualFold(s, e.String()) {
			return e, true
		}
	}
	return 0, false
}

func taintEffectNames() []string {
	var names []string
	for v := range clusterv1.TaintEffect_name {
		if e := clusterv1.TaintEffect(v); e != clusterv1.TaintEffect_TAINT_EFFECT_UNSPECIFIED {
			names = append(names, taintEffectName(e))
		}
	}
	sort.Strings(names)
	return names
}

// formatTaint renders a taint in the syntax --taint accepts.
func formatTaint(t *clusterv1.Taint) string {
	s := t.GetKey()
	if t.GetValue() != "" {
		s += "=" + t.GetValue()
	}
	return s + ":" + taintEffectName(t.GetEffect())
}

// readFileOrStdin reads path, or in when path is "-".
func readFileOrStdin(path string, in io.Reader) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(in)
	}
	return os.ReadFile(path)
}
