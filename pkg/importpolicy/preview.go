package importpolicy

import (
	"context"
	"encoding/json"
	"fmt"
)

// Preview is what PreviewImportPolicy answers: the rendered cluster without any credential
// value (only whether credentials were rendered), and every problem with its field path.
type Preview struct {
	Name       string          `json:"name"`
	Create     bool            `json:"create"`
	Cluster    *PreviewCluster `json:"cluster,omitempty"`
	References []Target        `json:"references,omitempty"`
	Errors     FieldErrors     `json:"errors,omitempty"`
	Conditions []Condition     `json:"conditions,omitempty"`
}

// PreviewCluster is a rendered cluster as the preview shows it.
type PreviewCluster struct {
	Labels              map[string]string `json:"labels,omitempty"`
	Claims              map[string]string `json:"claims,omitempty"`
	Taints              []Taint           `json:"taints,omitempty"`
	Server              string            `json:"server,omitempty"`
	CredentialsRendered bool              `json:"credentialsRendered"`
}

// Preview validates p and renders it against sourceObject, taking each reference from refs by
// key (JSON). It creates nothing. A supplied reference whose metadata names another object
// than the one the policy resolves is an error: the lifecycle would fetch that other object.
func (e *Engine) Preview(ctx context.Context, p *ImportPolicy, sourceObject []byte, refs map[string][]byte) *Preview {
	c, errs := e.Compile(p)
	if len(errs) > 0 {
		return &Preview{Errors: errs}
	}
	f := FetcherFunc(func(_ context.Context, t Target) ([]byte, error) {
		raw, ok := refs[t.Key]
		if !ok {
			return nil, fmt.Errorf("not supplied (give it as references[%q]): %w", t.Key, ErrNotFound)
		}
		var meta struct {
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		// Only what the supplied object says is compared: a hand-written fixture may leave
		// out its namespace.
		if json.Unmarshal(raw, &meta) == nil && ((meta.Metadata.Name != "" && meta.Metadata.Name != t.Name) ||
			(meta.Metadata.Namespace != "" && meta.Metadata.Namespace != t.Namespace)) {
			return nil, fmt.Errorf("the supplied object is %s/%s, not the one the templates resolve", meta.Metadata.Namespace, meta.Metadata.Name)
		}
		return raw, nil
	})
	return e.Render(ctx, c, sourceObject, f).Preview()
}

// Preview strips r of credential values. Messages in r are already redacted.
func (r *Result) Preview() *Preview {
	p := &Preview{Name: r.Name, Create: r.Create, References: r.References, Errors: r.Errors, Conditions: r.Conditions}
	if d := r.Cluster; d != nil {
		p.Cluster = &PreviewCluster{
			Labels:              d.Labels,
			Claims:              d.Claims,
			Taints:              d.Taints,
			Server:              d.Server(),
			CredentialsRendered: d.Credentials != nil,
		}
	}
	return p
}
