package importpolicy

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/fleetstream/fleetstream/pkg/kubecreds"
)

// Target is a reference resolved for one source object: what the caller must fetch.
type Target struct {
	Key       string `json:"key"`
	Group     string `json:"group"`
	Version   string `json:"version,omitempty"`
	Resource  string `json:"resource"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

func (t Target) String() string {
	gr := t.Resource
	if t.Group != "" {
		gr += "." + t.Group
	}
	if t.Namespace == "" {
		return gr + " " + t.Name
	}
	return gr + " " + t.Namespace + "/" + t.Name
}

// ErrNotFound is what a Fetcher returns (wrapped or not) when the object does not exist.
var ErrNotFound = errors.New("not found")

// Fetcher gets a referenced object as JSON. The lifecycle asks the inventory cluster's agent;
// the preview looks it up among the objects the caller supplied.
type Fetcher interface {
	Fetch(ctx context.Context, t Target) ([]byte, error)
}

// FetcherFunc adapts a function to Fetcher.
type FetcherFunc func(ctx context.Context, t Target) ([]byte, error)

// Fetch calls f.
func (f FetcherFunc) Fetch(ctx context.Context, t Target) ([]byte, error) { return f(ctx, t) }

// ClusterDocument is what the policy's template renders (YAML or JSON). It mirrors
// RegisterClusterRequest: labels, claims and taints, and the connection credentials with
// protojson's names (bytes fields in base64, as a Secret's data already is).
type ClusterDocument struct {
	Labels      map[string]string `json:"labels,omitempty"`
	Claims      map[string]string `json:"claims,omitempty"`
	Taints      []Taint           `json:"taints,omitempty"`
	Credentials *Credentials      `json:"credentials,omitempty"`
}

// Taint of a rendered cluster. Effect is the proto enum name (TAINT_EFFECT_NO_SELECT, ...);
// the document may also say NoSelect or NO_SELECT.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

// Credentials mirror fleetstream.cluster.v1.ConnectionCredentials: a kubeconfig, or a server
// with a CA and a token or a client certificate and key.
type Credentials struct {
	Kubeconfig               []byte `json:"kubeconfig,omitempty"`
	Server                   string `json:"server,omitempty"`
	CertificateAuthorityData []byte `json:"certificateAuthorityData,omitempty"`
	Token                    string `json:"token,omitempty"`
	ClientCertificateData    []byte `json:"clientCertificateData,omitempty"`
	ClientKeyData            []byte `json:"clientKeyData,omitempty"`
}

// Condition of a lifecycle, as the package computes them (SourceValid, ReferencesResolved,
// Rendered); Status is "True", "False" or "Unknown" (not evaluated because an earlier step
// failed).
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// Condition types.
const (
	ConditionSourceValid        = "SourceValid"
	ConditionReferencesResolved = "ReferencesResolved"
	ConditionRendered           = "Rendered"
)

// Result is the full outcome of rendering one source object, credentials included: for the
// lifecycle only. Anything shown to people goes through Preview.
type Result struct {
	// Name of the lifecycle and the cluster.
	Name string
	// Selected is the selector template's verdict; a source not selected has no lifecycle.
	Selected bool
	// References resolved, in the order they were fetched.
	References []Target
	// Create is the creation condition's verdict. It matters only before the cluster exists.
	Create bool
	// Cluster is the rendered cluster, nil when the template failed.
	Cluster *ClusterDocument
	// Errors found, with field paths; messages carry no secret.
	Errors FieldErrors
	// Conditions SourceValid, ReferencesResolved and Rendered, in that order.
	Conditions []Condition
}

// CanCreate reports whether a lifecycle may create the cluster now: the creation condition is
// true and everything rendered without error. Create alone is only the condition's verdict
// (what the preview shows).
func (r *Result) CanCreate() bool {
	return r.Create && r.Cluster != nil && r.Name != "" && len(r.Errors) == 0
}

// Server is the API server the cluster is reached at: the credentials' server, or the one
// the kubeconfig's current context names. Empty when none.
func (d *ClusterDocument) Server() string {
	if d == nil || d.Credentials == nil {
		return ""
	}
	if d.Credentials.Server != "" {
		return d.Credentials.Server
	}
	s, _, _ := parseKubeconfig(d.Credentials.Kubeconfig)
	return s
}

// Render renders one source object (JSON) with the compiled policy, fetching references with
// f (nil when the policy has none). It never returns an error: problems are in Result.Errors
// and the conditions, because a lifecycle shows them rather than failing.
func (e *Engine) Render(ctx context.Context, c *Compiled, source []byte, f Fetcher) *Result {
	r := &run{e: e, c: c, ctx: ctx, res: &Result{}}
	r.render(source, f)
	return r.res
}

type run struct {
	e   *Engine
	c   *Compiled
	ctx context.Context
	res *Result
	// red holds everything secret-looking (all Secret data, every credential): messages are
	// scrubbed of it. cred holds the credentials proper (tokens, keys, certificates, never the
	// server or names): a rendered value that is shown (name, labels, claims, taints, server)
	// must not contain them. The two differ so that a label or server taken from a Secret's
	// non-secret fields (Argo CD keeps the server and name in its cluster Secrets) is allowed.
	red, cred redactor
	stage     [3]*FieldError // first error of each condition
}

const (
	stageSource = iota
	stageRefs
	stageRender
)

func (r *run) fail(stage int, fe *FieldError) {
	r.res.Errors.add(fe)
	if r.stage[stage] == nil {
		r.stage[stage] = fe
	}
}

// exec runs one template, turning limit hits into their reasons.
func (r *run) exec(stage int, t *compiled, data map[string]any) (string, bool) {
	out, err := execute(r.ctx, t, data, r.e.funcs, r.e.limits)
	if err == nil {
		return out, true
	}
	reason := ReasonTemplateFailed
	switch {
	case errors.Is(err, ErrRenderTimeout):
		reason = ReasonRenderTimeout
	case errors.Is(err, ErrRenderTooLarge):
		reason = ReasonRenderTooLarge
	}
	r.fail(stage, fieldErr(t.field, reason, "%v", err))
	return "", false
}

func (r *run) render(sourceJSON []byte, f Fetcher) {
	defer r.finish()
	p := &r.c.Policy
	source, err := decodeObject(sourceJSON, r.e.limits.MaxObjectBytes)
	if err != nil {
		r.fail(stageSource, fieldErr("source_object", ReasonInvalidSource, "%v", err))
		return
	}
	// shadowSource is the source as the shown outputs may see it: a Secret's data hidden.
	shadowSource, secretRead := source, false
	if p.Source.Group == "" && p.Source.Resource == "secrets" {
		r.red.addSecretObject(source)
		r.cred.addCredentials(source)
		shadowSource, secretRead = shadowSecret(source), true
	}
	if msg := checkSource(p.Source, source); msg != "" {
		r.fail(stageSource, fieldErr("source_object", ReasonInvalidSource, "%s", msg))
		return
	}
	sourceData := map[string]any{"source": source}
	r.res.Selected = true
	if r.c.selector != nil {
		out, ok := r.exec(stageSource, r.c.selector, sourceData)
		if !ok {
			r.res.Selected = false
			return
		}
		r.res.Selected = isTrue(out)
		if !r.res.Selected {
			return
		}
	}

	if out, ok := r.exec(stageRender, r.c.name, sourceData); ok {
		// Trimmed, unlike Clusterpedia: a YAML block scalar ends the template with a newline.
		name := strings.TrimSpace(out)
		r.res.Name = name
		if name == "" {
			r.fail(stageRender, fieldErr("name_template", ReasonInvalidName, "renders an empty name"))
		}
		for _, m := range validation.IsDNS1123Label(name) {
			if name != "" {
				r.fail(stageRender, fieldErr("name_template", ReasonInvalidName, "renders %s: %s", short(name), m))
			}
		}
		if secretRead && name != "" {
			if shadow, ok := r.shadowExec("name_template", r.c.name, map[string]any{"source": shadowSource}); !ok || strings.TrimSpace(shadow) != name {
				if ok {
					r.fail(stageRender, fieldErr("name_template", ReasonSecretDerived, "the name is %s", secretDerived))
				}
				r.res.Name = ""
			}
		}
	}

	refs := make(map[string]any, len(p.References))
	shadowRefs := make(map[string]any, len(p.References))
	data := map[string]any{"source": source, "references": refs}
	for _, i := range r.c.Order {
		t, obj, ok := r.resolve(i, data, f)
		if !ok {
			return
		}
		r.res.References = append(r.res.References, t)
		refs[t.Key] = obj
		shadowRefs[t.Key] = obj
		if p.References[i].IsSecret() {
			shadowRefs[t.Key], secretRead = shadowSecret(obj), true
		}
	}

	if out, ok := r.exec(stageRender, r.c.condition, data); ok {
		r.res.Create = isTrue(out)
	}
	if out, ok := r.exec(stageRender, r.c.template, data); ok {
		doc := r.decodeCluster(out)
		if doc != nil && secretRead {
			doc = r.checkShown(doc, map[string]any{"source": shadowSource, "references": shadowRefs})
		}
		r.res.Cluster = doc
	}
}

// shadowExec runs t over shadow data (Secret data hidden, see shadow.go). A template that
// fails there but not over the real data depends on Secret data for more than credentials:
// that is refused on field.
func (r *run) shadowExec(field string, t *compiled, shadow map[string]any) (string, bool) {
	out, err := execute(r.ctx, t, shadow, r.e.funcs, r.e.limits)
	if err == nil {
		return out, true
	}
	reason := ReasonSecretDerived
	switch {
	case errors.Is(err, ErrRenderTimeout):
		reason = ReasonRenderTimeout
	case errors.Is(err, ErrRenderTooLarge):
		reason = ReasonRenderTooLarge
	}
	r.fail(stageRender, fieldErr(field, reason, "fails when Secret data is hidden (%v): what it shows must not depend on Secret data, which may only flow into credentials", err))
	return "", false
}

// checkShown renders the template again over shadow data and refuses the document when a
// shown field (labels, claims, taints) comes out differently: it was computed from Secret
// data. The document kept is then equal, in those fields, to one rendered without any Secret
// data.
func (r *run) checkShown(doc *ClusterDocument, shadow map[string]any) *ClusterDocument {
	out, ok := r.shadowExec("template", r.c.template, shadow)
	if !ok {
		return nil
	}
	shown, err := parseShown(out)
	if err != nil {
		r.fail(stageRender, fieldErr("template", ReasonSecretDerived, "does not parse when Secret data is hidden (%v): the document's shape must not depend on Secret data", err))
		return nil
	}
	ok = true
	compareShown(doc, shown, func(field, format string, args ...any) {
		ok = false
		r.fail(stageRender, fieldErr("template: "+field, ReasonSecretDerived, format, args...))
	})
	if !ok {
		return nil
	}
	return doc
}

// resolve renders reference i's namespace and name and fetches it.
func (r *run) resolve(i int, data map[string]any, f Fetcher) (Target, map[string]any, bool) {
	ref := r.c.Policy.References[i]
	field := fmt.Sprintf("references[%d]", i)
	t := Target{Key: ref.Key, Group: ref.Group, Version: ref.Version, Resource: ref.Resource}
	if nt := r.c.refNamespace[i]; nt != nil {
		out, ok := r.exec(stageRefs, nt, data)
		if !ok {
			return t, nil, false
		}
		t.Namespace = strings.TrimSpace(out)
		for _, m := range validation.IsDNS1123Label(t.Namespace) {
			if t.Namespace != "" {
				r.fail(stageRefs, fieldErr(field+".namespace_template", ReasonReferenceInvalid, "renders %s: %s", short(t.Namespace), m))
				return t, nil, false
			}
		}
	}
	out, ok := r.exec(stageRefs, r.c.refName[i], data)
	if !ok {
		return t, nil, false
	}
	t.Name = strings.TrimSpace(out)
	if t.Name == "" {
		r.fail(stageRefs, fieldErr(field+".name_template", ReasonReferenceInvalid, "renders an empty name"))
		return t, nil, false
	}
	for _, m := range validation.IsDNS1123Subdomain(t.Name) {
		r.fail(stageRefs, fieldErr(field+".name_template", ReasonReferenceInvalid, "renders %s: %s", short(t.Name), m))
		return t, nil, false
	}
	if f == nil {
		r.fail(stageRefs, fieldErr(field, ReasonReferenceNotFound, "%s (key %s) was not supplied", t, ref.Key))
		return t, nil, false
	}
	raw, err := f.Fetch(r.ctx, t)
	if err != nil {
		reason := ReasonReferenceNotFound
		if !errors.Is(err, ErrNotFound) {
			reason = ReasonReferenceInvalid
		}
		r.fail(stageRefs, fieldErr(field, reason, "%s: %v", t, err))
		return t, nil, false
	}
	obj, err := decodeObject(raw, r.e.limits.MaxObjectBytes)
	if err != nil {
		r.fail(stageRefs, fieldErr(field, ReasonReferenceInvalid, "%s: %v", t, err))
		return t, nil, false
	}
	if ref.IsSecret() {
		r.red.addSecretObject(obj)
		r.cred.addCredentials(obj)
	}
	return t, obj, true
}

// decodeCluster parses the rendered template and checks it. Credential values go into the
// redactor first so that no later message can show them.
func (r *run) decodeCluster(out string) *ClusterDocument {
	js, err := yaml.YAMLToJSON([]byte(out))
	if err != nil {
		r.fail(stageRender, fieldErr("template", ReasonInvalidCluster, "rendered document is not YAML: %v", err))
		return nil
	}
	var doc ClusterDocument
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if string(bytes.TrimSpace(js)) != "null" {
		if err := dec.Decode(&doc); err != nil {
			r.fail(stageRender, fieldErr("template", ReasonInvalidCluster, "rendered document: %s", jsonErr(err)))
			return nil
		}
	}
	if c := doc.Credentials; c != nil {
		r.red.addBytes(c.Kubeconfig)
		r.red.add(c.Token)
		r.red.addBytes(c.CertificateAuthorityData)
		r.red.addBytes(c.ClientCertificateData)
		r.red.addBytes(c.ClientKeyData)
		r.cred.add(c.Token)
		r.cred.addBytes(c.ClientCertificateData)
		r.cred.addBytes(c.ClientKeyData)
		if _, secrets, err := parseKubeconfig(c.Kubeconfig); err == nil {
			for _, sec := range secrets {
				r.cred.add(sec)
				r.red.add(sec)
			}
		}
	}
	ok := true
	bad := func(field, format string, args ...any) {
		ok = false
		r.fail(stageRender, fieldErr("template: "+field, ReasonInvalidCluster, format, args...))
	}
	checkMap := func(field string, m map[string]string, maxEntries int, value func(string) []string) {
		if len(m) > maxEntries {
			bad(field, "%d entries, at most %d", len(m), maxEntries)
			return
		}
		for _, k := range sortedKeys(m) {
			f := fmt.Sprintf("%s[%s]", field, short(k))
			for _, msg := range validation.IsQualifiedName(k) {
				bad(f, "key: %s", msg)
			}
			for _, msg := range value(m[k]) {
				bad(f, "value %s: %s", short(m[k]), msg)
			}
			// Labels and claims are listed to anyone who may read clusters.
			if r.cred.contains(k) || r.cred.contains(m[k]) {
				bad(f, "holds a secret value; labels, claims and taints are not secret")
			}
		}
	}
	checkMap("labels", doc.Labels, maxLabels, validation.IsValidLabelValue)
	if _, ok := doc.Labels[LabelAllowImportCredentials]; ok {
		bad(fmt.Sprintf("labels[%s]", short(LabelAllowImportCredentials)), "only a platform admin sets this label (UpdateCluster), never an import")
	}
	checkMap("claims", doc.Claims, maxLabels, func(v string) []string {
		if len(v) > maxClaimValue {
			return []string{fmt.Sprintf("longer than %d bytes", maxClaimValue)}
		}
		return nil
	})
	if len(doc.Taints) > maxTaints {
		bad("taints", "%d taints, at most %d", len(doc.Taints), maxTaints)
	}
	for i := range doc.Taints {
		if i >= maxTaints {
			break
		}
		t := &doc.Taints[i]
		f := fmt.Sprintf("taints[%d]", i)
		for _, msg := range validation.IsQualifiedName(t.Key) {
			bad(f+".key", "%s: %s", short(t.Key), msg)
		}
		for _, msg := range validation.IsValidLabelValue(t.Value) {
			bad(f+".value", "%s: %s", short(t.Value), msg)
		}
		if r.cred.contains(t.Key) || r.cred.contains(t.Value) {
			bad(f, "holds a secret value; labels, claims and taints are not secret")
		}
		eff, okEff := taintEffect(t.Effect)
		if !okEff {
			bad(f+".effect", "%s: want NoSelect, NoSelectIfNew or PreferNoSelect", short(t.Effect))
		}
		t.Effect = eff
	}
	if c := doc.Credentials; c != nil {
		r.checkCredentials(c, bad)
	}
	if !ok {
		return nil
	}
	return &doc
}

// checkCredentials mirrors cluster-import's validation of ConnectionCredentials, never quoting
// a value that could be secret (a kubeconfig's parse error may quote the kubeconfig).
func (r *run) checkCredentials(c *Credentials, bad func(string, string, ...any)) {
	if len(c.Kubeconfig) > 0 {
		if c.Server != "" || c.Token != "" || len(c.ClientCertificateData) > 0 {
			bad("credentials", "give either kubeconfig or server with token/client certificate, not both")
		}
		if s, _, err := parseKubeconfig(c.Kubeconfig); err != nil || s == "" {
			bad("credentials.kubeconfig", "not a valid kubeconfig with a cluster server")
		} else if msg := checkServer(s); msg != "" {
			bad("credentials.kubeconfig", "server: %s", msg)
		}
		// Exec plugins, file paths and unlisted proxies: the fields named, never their values.
		var ke *kubecreds.Error
		if _, err := kubecreds.Kubeconfig(c.Kubeconfig, r.e.creds); errors.As(err, &ke) {
			for _, fe := range ke.Fields {
				if fe.Field != "" { // a parse error is reported above
					bad("credentials.kubeconfig."+fe.Field, "%s", fe.Reason)
				}
			}
		}
		return
	}
	if c.Server == "" {
		bad("credentials.server", "required unless kubeconfig is given")
	} else if msg := checkServer(c.Server); msg != "" {
		bad("credentials.server", "%s", msg)
	} else if r.cred.contains(c.Server) {
		bad("credentials.server", "holds a secret value")
	}
	if c.Token == "" && (len(c.ClientCertificateData) == 0 || len(c.ClientKeyData) == 0) {
		bad("credentials", "give a token or a client certificate and key")
	}
}

func checkServer(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Sprintf("%s: want an https:// URL", short(s))
	}
	if u.User != nil {
		// Not quoted: the user info may be a password.
		return "must not carry user info"
	}
	return ""
}

// parseKubeconfig returns the server of the kubeconfig's current context (or of its only
// cluster) and the users' secrets (tokens, passwords, client keys and certificates, as written
// and decoded). A minimal parse: the package need not pull client-go for these.
func parseKubeconfig(kc []byte) (server string, secrets []string, err error) {
	var cfg struct {
		CurrentContext string `json:"current-context"`
		Contexts       []struct {
			Name    string `json:"name"`
			Context struct {
				Cluster string `json:"cluster"`
			} `json:"context"`
		} `json:"contexts"`
		Clusters []struct {
			Name    string `json:"name"`
			Cluster struct {
				Server string `json:"server"`
			} `json:"cluster"`
		} `json:"clusters"`
		Users []struct {
			User struct {
				Token                 string `json:"token"`
				Password              string `json:"password"`
				ClientKeyData         []byte `json:"client-key-data"`
				ClientCertificateData []byte `json:"client-certificate-data"`
			} `json:"user"`
		} `json:"users"`
	}
	if err := yaml.Unmarshal(kc, &cfg); err != nil {
		return "", nil, errors.New("not a kubeconfig")
	}
	for _, u := range cfg.Users {
		secrets = append(secrets, u.User.Token, u.User.Password, string(u.User.ClientKeyData), string(u.User.ClientCertificateData),
			base64.StdEncoding.EncodeToString(u.User.ClientKeyData), base64.StdEncoding.EncodeToString(u.User.ClientCertificateData))
	}
	cluster := ""
	for _, c := range cfg.Contexts {
		if c.Name == cfg.CurrentContext {
			cluster = c.Context.Cluster
		}
	}
	for _, c := range cfg.Clusters {
		if c.Name == cluster || (cluster == "" && len(cfg.Clusters) == 1) {
			return c.Cluster.Server, secrets, nil
		}
	}
	return "", secrets, errors.New("no cluster for the current context")
}

// taintEffect normalizes NoSelect, NO_SELECT and TAINT_EFFECT_NO_SELECT to the enum name.
func taintEffect(s string) (string, bool) {
	n := strings.ToUpper(strings.ReplaceAll(strings.TrimPrefix(strings.ToUpper(s), "TAINT_EFFECT_"), "_", ""))
	switch n {
	case "NOSELECT":
		return "TAINT_EFFECT_NO_SELECT", true
	case "NOSELECTIFNEW":
		return "TAINT_EFFECT_NO_SELECT_IF_NEW", true
	case "PREFERNOSELECT":
		return "TAINT_EFFECT_PREFER_NO_SELECT", true
	}
	return s, false
}

// Bounds of a rendered cluster, the registry's (pkg/apierr) so a rendered cluster that passes
// here also passes RegisterCluster.
const (
	maxLabels     = 100
	maxTaints     = 50
	maxClaimValue = 1024
)

// jsonErr describes a decoding error without quoting the input.
func jsonErr(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("%s: cannot be a %s", te.Field, te.Value)
	}
	msg := err.Error()
	if strings.Contains(msg, "base64") {
		return "a bytes field is not valid base64"
	}
	return strings.TrimPrefix(msg, "json: ")
}

// isTrue is Clusterpedia's verdict: the rendered text, "<no value>" removed, trimmed and
// lower-cased, equals "true". Empty is false.
func isTrue(out string) bool {
	return strings.ToLower(strings.TrimSpace(out)) == "true"
}

// checkSource verifies the object is of the policy's source type as far as the object says.
func checkSource(s Source, obj map[string]any) string {
	md, _ := obj["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	if name == "" {
		return "metadata.name is required"
	}
	if av, ok := obj["apiVersion"].(string); ok {
		g := ""
		if i := strings.LastIndex(av, "/"); i >= 0 {
			g = av[:i]
		}
		if g != s.Group {
			return fmt.Sprintf("apiVersion %s is not of group %s", short(av), short(s.Group))
		}
	}
	if s.Namespace != "" {
		if ns, _ := md["namespace"].(string); ns != s.Namespace {
			return fmt.Sprintf("not in namespace %s", short(s.Namespace))
		}
	}
	return ""
}

// decodeObject parses one object's JSON. Integers become int64 as in Kubernetes'
// unstructured objects, so `eq .source.spec.replicas 3` works as in Clusterpedia.
func decodeObject(raw []byte, limit int) (map[string]any, error) {
	if len(raw) > limit {
		return nil, fmt.Errorf("%d bytes, at most %d", len(raw), limit)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not JSON: %s", jsonErr(err))
	}
	if dec.More() {
		return nil, errors.New("not one JSON value")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("not a JSON object")
	}
	out, err := numbers(obj, 0)
	if err != nil {
		return nil, err
	}
	return out.(map[string]any), nil
}

// maxDepth bounds the nesting of an object. Kubernetes objects nest a few dozen levels; a
// deeper one only serves to make toPrettyJson's indentation quadratic.
const maxDepth = 100

func numbers(v any, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d levels", maxDepth)
	}
	var err error
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if v[k], err = numbers(e, depth+1); err != nil {
				return nil, err
			}
		}
	case []any:
		for i, e := range v {
			if v[i], err = numbers(e, depth+1); err != nil {
				return nil, err
			}
		}
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i, nil
		}
		f, _ := v.Float64()
		return f, nil
	}
	return v, nil
}

// finish redacts every message and computes the conditions.
func (r *run) finish() {
	if r.cred.contains(r.res.Name) {
		r.fail(stageRender, fieldErr("name_template", ReasonInvalidName, "renders a name holding a credential"))
		r.res.Name = ""
	}
	for _, fe := range r.res.Errors {
		fe.Message = r.cred.redact(r.red.redact(fe.Message))
	}
	cond := func(typ string, stage int, okReason, okMsg string) Condition {
		if fe := r.stage[stage]; fe != nil {
			return Condition{Type: typ, Status: "False", Reason: fe.Reason, Message: fe.Error()}
		}
		return Condition{Type: typ, Status: "True", Reason: okReason, Message: okMsg}
	}
	src := cond(ConditionSourceValid, stageSource, "Valid", "")
	if src.Status == "True" && !r.res.Selected {
		src = Condition{Type: ConditionSourceValid, Status: "False", Reason: ReasonNotSelected, Message: "source.selector_template does not render true"}
	}
	refs := cond(ConditionReferencesResolved, stageRefs, "Resolved", fmt.Sprintf("%d references", len(r.res.References)))
	rendered := cond(ConditionRendered, stageRender, "Rendered", "")
	if src.Status != "True" {
		refs = Condition{Type: ConditionReferencesResolved, Status: "Unknown", Reason: "SourceNotValid"}
		rendered = Condition{Type: ConditionRendered, Status: "Unknown", Reason: "SourceNotValid"}
	} else if refs.Status != "True" {
		rendered = Condition{Type: ConditionRendered, Status: "Unknown", Reason: "ReferencesNotResolved"}
	} else if rendered.Status == "True" && !r.res.Create {
		rendered.Message = "creation condition is not true"
	}
	r.res.Conditions = []Condition{src, refs, rendered}
}
