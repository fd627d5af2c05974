package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"

	"google.golang.org/protobuf/encoding/protojson"
)

// Fields flattens what o declares into its leaf fields: field path → value as compact JSON
// (`"8"` for the string 8). Paths are written as in apply's messages: `spec.hard.cpu`,
// `metadata.labels[applyset.fleetstream.io/part-of]` for a key that is no identifier, and
// `spec.budgets[cluster=eu-1].hard.cpu` for an element of a list whose elements are objects told
// apart by a key field (cluster, key or name, unique in the list), as Kubernetes' list-map
// types are. Any other list is one field (atomic): its elements have no identity to own one
// by one. Empty maps and lists set nothing. Labels count only for the kinds whose labels the
// API keeps; annotations never (the API does not store them).
//
// These are the units of field ownership: apply records, per apply set, the fields it applied,
// and refuses to overwrite one that someone else changed since.
func Fields(o *Object) (map[string]string, error) {
	out := map[string]string{}
	if o.Kind.Labels {
		for k, v := range o.Labels {
			b, _ := json.Marshal(v)
			out[fieldJoin("metadata.labels", k)] = string(b)
		}
	}
	raw, err := protojson.Marshal(o.Kind.Clean(o.Spec))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Key(), err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var spec any
	if err := dec.Decode(&spec); err != nil {
		return nil, fmt.Errorf("%s: %w", o.Key(), err)
	}
	flatten(out, "spec", spec)
	return out, nil
}

// listKeys are the fields that identify an element of a list of objects, in the order tried
// (ip: a service's endpoint weights, whose IPs are unique but in the rare service that has one
// IP in two clusters, where the list is one field).
var listKeys = []string{"cluster", "key", "name", "ip"}

func flatten(out map[string]string, path string, v any) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			flatten(out, fieldJoin(path, k), e)
		}
	case []any:
		if len(v) == 0 {
			return
		}
		if key := elementKey(v); key != "" {
			for _, e := range v {
				m := e.(map[string]any)
				flatten(out, fmt.Sprintf("%s[%s=%s]", path, key, m[key]), m)
			}
			return
		}
		b, _ := json.Marshal(v)
		out[path] = string(b)
	default:
		b, _ := json.Marshal(v)
		out[path] = string(b)
	}
}

// elementKey is the field that tells list's elements apart, or "" when none does (the list
// is then one field).
func elementKey(list []any) string {
	for _, key := range listKeys {
		seen := map[string]bool{}
		ok := true
		for _, e := range list {
			m, isMap := e.(map[string]any)
			s, isString := m[key].(string)
			if !isMap || !isString || s == "" || seen[s] {
				ok = false
				break
			}
			seen[s] = true
		}
		if ok {
			return key
		}
	}
	return ""
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func fieldJoin(path, key string) string {
	if identRE.MatchString(key) {
		return path + "." + key
	}
	return path + "[" + key + "]"
}
