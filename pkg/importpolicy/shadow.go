package importpolicy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"
)

// Secret data may only flow into credentials. A name, label, claim or taint is shown to anyone
// who may read clusters and kept in events for ever, and redacting copies of a secret (the
// redactor) cannot catch what a template computes from it: printf "%x", upper, a substr
// chunk. So the outputs that are shown are rendered a second time, over a shadow of the data
// in which every Secret's data is replaced by a value of the same shape (same length, same
// document keys) that holds nothing of it. An output that comes out differently was computed
// from Secret data and is refused; one that comes out the same is a function of the shape
// alone, whatever the template did with the values.

// lastApplied is the annotation kubectl apply writes: on a Secret it holds the data in clear.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// shadowSecret returns a Secret object whose data, stringData and last-applied annotation
// are replaced by placeholders of the same shape; everything else is shared with obj.
func shadowSecret(obj map[string]any) map[string]any {
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		out[k] = v
	}
	for _, field := range []string{"data", "stringData"} {
		m, ok := obj[field].(map[string]any)
		if !ok {
			if obj[field] != nil {
				out[field] = hideValue(obj[field], 0)
			}
			continue
		}
		hidden := make(map[string]any, len(m))
		for k, v := range m {
			s, ok := v.(string)
			if !ok {
				hidden[k] = hideValue(v, 0)
				continue
			}
			if field == "data" {
				if b, err := base64.StdEncoding.DecodeString(s); err == nil {
					hidden[k] = base64.StdEncoding.EncodeToString([]byte(hideText(string(b))))
					continue
				}
			}
			hidden[k] = hideText(s)
		}
		out[field] = hidden
	}
	if md, ok := obj["metadata"].(map[string]any); ok {
		if ann, ok := md["annotations"].(map[string]any); ok && ann[lastApplied] != nil {
			md2 := make(map[string]any, len(md))
			for k, v := range md {
				md2[k] = v
			}
			ann2 := make(map[string]any, len(ann))
			for k, v := range ann {
				ann2[k] = v
			}
			ann2[lastApplied] = hideValue(ann[lastApplied], 0)
			md2["annotations"] = ann2
			out["metadata"] = md2
		}
	}
	return out
}

// hideText replaces a Secret value by one of its shape: a YAML or JSON document (a kubeconfig,
// an Argo CD config) keeps its keys and has its values hidden, in the same syntax, so that
// templates parsing it for the credentials still run; any other text becomes as many x.
func hideText(s string) string {
	if len(s) <= maxParsedSecret {
		var doc any
		if yaml.Unmarshal([]byte(s), &doc) == nil {
			switch doc.(type) {
			case map[string]any, []any:
				hidden := hideValue(doc, 0)
				var out []byte
				var err error
				if t := strings.TrimSpace(s); strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[") {
					out, err = json.Marshal(hidden)
				} else {
					out, err = yaml.Marshal(hidden)
				}
				if err == nil {
					return string(out)
				}
			}
		}
	}
	return strings.Repeat("x", len(s))
}

// hideValue hides the leaves of a decoded document: strings become as many x, numbers 0.
// Booleans and nulls stay: a switch such as insecure: true is no secret.
func hideValue(v any, depth int) any {
	if depth > maxDepth {
		return nil
	}
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = hideValue(e, depth+1)
		}
		return m
	case []any:
		l := make([]any, len(v))
		for i, e := range v {
			l[i] = hideValue(e, depth+1)
		}
		return l
	case string:
		return strings.Repeat("x", len(v))
	case int64:
		return int64(0)
	case float64:
		return float64(0)
	case json.Number:
		return json.Number("0")
	}
	return v
}

// shownFields is what a rendered cluster document shows to everyone: all but credentials.
type shownFields struct {
	Labels map[string]string `json:"labels,omitempty"`
	Claims map[string]string `json:"claims,omitempty"`
	Taints []Taint           `json:"taints,omitempty"`
}

// parseShown reads the shown fields of a rendered document, leniently: the real render was
// already checked; here only a difference matters.
func parseShown(out string) (*shownFields, error) {
	js, err := yaml.YAMLToJSON([]byte(out))
	if err != nil {
		return nil, err
	}
	var f shownFields
	if string(bytes.TrimSpace(js)) != "null" {
		if err := json.Unmarshal(js, &f); err != nil {
			return nil, fmt.Errorf("%s", jsonErr(err))
		}
	}
	for i := range f.Taints {
		if eff, ok := taintEffect(f.Taints[i].Effect); ok {
			f.Taints[i].Effect = eff
		}
	}
	return &f, nil
}

// secretDerived is the message of an output computed from Secret data.
const secretDerived = "computed from a Secret's data: Secret data may only flow into credentials (names, labels, claims and taints are shown to everyone who may read clusters)"

// compareShown reports, on real's field paths, every shown field of the real document that
// the shadow render (over hidden Secret data) did not reproduce. A key only the real render
// has is not quoted: it may be the secret itself.
func compareShown(real *ClusterDocument, shadow *shownFields, bad func(field, format string, args ...any)) {
	maps := func(field string, r, s map[string]string) {
		for _, k := range sortedKeys(r) {
			sv, ok := s[k]
			switch {
			case !ok:
				bad(field, "a key is %s", secretDerived)
			case sv != r[k]:
				bad(fmt.Sprintf("%s[%s]", field, short(k)), "%s", secretDerived)
			}
		}
		for k := range s {
			if _, ok := r[k]; !ok {
				bad(field, "which keys there are is %s", secretDerived)
				break
			}
		}
	}
	maps("labels", real.Labels, shadow.Labels)
	maps("claims", real.Claims, shadow.Claims)
	if len(real.Taints) != len(shadow.Taints) {
		bad("taints", "how many there are is %s", secretDerived)
		return
	}
	for i, t := range real.Taints {
		if t != shadow.Taints[i] {
			bad(fmt.Sprintf("taints[%d]", i), "%s", secretDerived)
		}
	}
}
