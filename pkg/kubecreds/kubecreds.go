// Package kubecreds turns stored cluster credentials (a kubeconfig, or a server with a CA and a
// token or client certificate) into a client configuration that can do nothing but reach the
// cluster they name with the data they carry.
//
// A kubeconfig is code as much as data: client-go's loader runs `exec` and `auth-provider`
// plugins, reads `tokenFile`, `certificate-authority`, `client-certificate` and `client-key` from
// the local disk, impersonates with `as`, and sends everything through `proxy-url`. Credentials
// are written by platform admins and rendered by import policies from Secrets tenants may write,
// and loaded on the hub (fleetd, the hosted agents), so each of those is a way into the hub.
// This package accepts only inline data and builds the rest.Config itself; it never calls
// clientcmd's loader. It is used when credentials are written (cluster-import's API, import
// policy renders) and again when they are loaded (hosted agents), since values stored by older
// versions were never checked.
//
// What a kubeconfig may hold:
//   - clusters: server (https, no user info), certificate-authority-data, tls-server-name,
//     disable-compression, insecure-skip-tls-verify only when false, proxy-url only to a host
//     Policy.AllowedProxies lists;
//   - users: token, client-certificate-data with client-key-data;
//   - contexts: cluster, user, namespace (unused);
//   - extensions anywhere, and preferences: accepted and never interpreted;
//   - apiVersion, kind, current-context.
//
// Everything else is refused with the path of the field, unknown fields included: a field added
// to kubeconfigs later may read a file or run a command too. Every entry is checked, not only
// the current context's. Refused on purpose besides files and plugins: username/password
// (Kubernetes dropped basic authentication in 1.19), impersonation (as, as-uid, as-groups,
// as-user-extra: the credentials must act as themselves), and insecure-skip-tls-verify: true
// (the hub always verifies the member's apiserver; give certificate-authority-data).
package kubecreds

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
)

// Policy is what an operator allows beyond inline data.
type Policy struct {
	// AllowedProxies are the proxies a kubeconfig's proxy-url may name: a host (any port) or
	// host:port. Empty refuses every proxy-url.
	AllowedProxies []string
}

// RegisterFlags adds --credentials-allowed-proxies (cluster-import, cluster-agent --hosted,
// fleetd; env FLEETSTREAM_CREDENTIALS_ALLOWED_PROXIES is its default).
func (p *Policy) RegisterFlags(fs *flag.FlagSet) {
	p.AllowedProxies = splitList(os.Getenv("FLEETSTREAM_CREDENTIALS_ALLOWED_PROXIES"))
	fs.Func("credentials-allowed-proxies", "comma-separated proxies (host or host:port) a stored kubeconfig's proxy-url may name; empty refuses every proxy-url (env FLEETSTREAM_CREDENTIALS_ALLOWED_PROXIES)",
		func(s string) error { p.AllowedProxies = splitList(s); return nil })
}

// Validate checks --credentials-allowed-proxies: each entry a host or host:port, not a URL.
func (p Policy) Validate() error {
	for _, a := range p.AllowedProxies {
		if strings.Contains(a, "@") {
			// It may be user:password@host: not quoted back.
			return errors.New("--credentials-allowed-proxies: an entry with credentials (user@host): want a host or host:port, not a URL")
		}
		if strings.Contains(a, "/") {
			return fmt.Errorf("--credentials-allowed-proxies %q: want a host or host:port, not a URL", a)
		}
		if _, port, err := net.SplitHostPort(a); err == nil {
			if _, err := strconv.ParseUint(port, 10, 16); err != nil {
				return fmt.Errorf("--credentials-allowed-proxies %q: port %q is not a number from 0 to 65535", a, port)
			}
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, strings.ToLower(p))
		}
	}
	return out
}

// proxyAllowed reports whether u's host is listed, by name alone or with its port.
func (p Policy) proxyAllowed(u *url.URL) bool {
	host := strings.ToLower(u.Hostname())
	for _, a := range p.AllowedProxies {
		a = strings.ToLower(a)
		if a == host || (u.Port() != "" && a == strings.ToLower(u.Host)) {
			return true
		}
	}
	return false
}

// FieldError is one refused field, by its path in the kubeconfig (users[0].user.exec) or the
// credentials (server). It never quotes a value: values may be secret.
type FieldError struct {
	Field  string
	Reason string
}

func (e FieldError) Error() string {
	if e.Field == "" {
		return e.Reason
	}
	return e.Field + ": " + e.Reason
}

// Error lists every refused field of one set of credentials.
type Error struct {
	Fields []FieldError
}

func (e *Error) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Error()
	}
	return "credentials refused: " + strings.Join(parts, "; ")
}

// maxFieldErrors bounds an Error: a kubeconfig with a thousand bad users gets a short answer.
const maxFieldErrors = 20

// Credentials are validated inline credentials, everything a client needs.
type Credentials struct {
	Server             string
	TLSServerName      string
	CAData             []byte
	Token              string
	CertData, KeyData  []byte
	ProxyURL           *url.URL
	DisableCompression bool
}

// RESTConfig is the client configuration of c, built field by field: no exec or auth-provider
// plugin, no file, no impersonation. Without a proxy-url, client-go's default applies (the
// process's HTTPS_PROXY/NO_PROXY environment, which the operator controls).
func (c *Credentials) RESTConfig() *rest.Config {
	cfg := &rest.Config{
		Host:        c.Server,
		BearerToken: c.Token,
		TLSClientConfig: rest.TLSClientConfig{
			ServerName: c.TLSServerName,
			CAData:     slices.Clone(c.CAData),
			CertData:   slices.Clone(c.CertData),
			KeyData:    slices.Clone(c.KeyData),
		},
		DisableCompression: c.DisableCompression,
	}
	if c.ProxyURL != nil {
		cfg.Proxy = http.ProxyURL(c.ProxyURL)
	}
	return cfg
}

// Load validates stored or submitted connection credentials, a kubeconfig or the inline
// fields, and returns them ready for RESTConfig. A refusal is an *Error.
func Load(c *clusterv1.ConnectionCredentials, p Policy) (*Credentials, error) {
	if len(c.GetKubeconfig()) > 0 {
		return Kubeconfig(c.Kubeconfig, p)
	}
	cr := &Credentials{Server: c.GetServer(), CAData: c.GetCertificateAuthorityData(), Token: c.GetToken(),
		CertData: c.GetClientCertificateData(), KeyData: c.GetClientKeyData()}
	var errs errList
	errs.server("server", cr.Server)
	errs.auth("", cr)
	return cr, errs.err()
}

// Kubeconfig parses and validates a kubeconfig and returns the credentials of its current
// context (or of its only context when none is current). A refusal is an *Error naming every
// refused field.
func Kubeconfig(data []byte, p Policy) (*Credentials, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		// The parser's message may quote the document, which holds secrets.
		return nil, &Error{Fields: []FieldError{{Reason: "not a valid kubeconfig (not YAML)"}}}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, &Error{Fields: []FieldError{{Reason: "not a valid kubeconfig"}}}
	}
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, &Error{Fields: []FieldError{{Reason: "not a valid kubeconfig (not a mapping)"}}}
	}
	k := &kubeconfig{p: p}
	k.walk(top)
	if err := k.errs.err(); err != nil {
		return nil, err
	}
	cr := k.resolve()
	return cr, k.errs.err()
}

// errList collects FieldErrors up to maxFieldErrors.
type errList struct{ list []FieldError }

func (e *errList) add(field, format string, args ...any) {
	if len(e.list) < maxFieldErrors {
		e.list = append(e.list, FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
}

func (e *errList) err() error {
	if len(e.list) == 0 {
		return nil
	}
	return &Error{Fields: e.list}
}

func (e *errList) server(field, s string) {
	if s == "" {
		e.add(field, "required")
		return
	}
	u, err := url.Parse(s)
	switch {
	case err != nil || u.Scheme != "https" || u.Host == "":
		e.add(field, "want an https:// URL")
	case u.User != nil:
		e.add(field, "must not carry user info")
	}
}

// auth requires a bearer token or a client certificate with its key.
func (e *errList) auth(field string, c *Credentials) {
	join := func(f string) string {
		if field == "" {
			return f
		}
		return field + "." + f
	}
	switch {
	case len(c.CertData) > 0 && len(c.KeyData) == 0:
		e.add(join("client-key-data"), "required with client-certificate-data")
	case len(c.KeyData) > 0 && len(c.CertData) == 0:
		e.add(join("client-certificate-data"), "required with client-key-data")
	case c.Token == "" && len(c.CertData) == 0:
		if field == "" {
			field = "token"
		}
		e.add(field, "give a token or a client certificate and key")
	}
}

// Why each refused field is refused.
const (
	whyFile    = "reads a file on the hub; only inline data is accepted (give %s)"
	whyExec    = "runs a command on the hub; only inline credentials are accepted"
	whyPlugin  = "runs an auth-provider plugin on the hub; only inline credentials are accepted"
	whyImp     = "impersonation is not accepted: the credentials act as their own user"
	whyBasic   = "basic authentication is not accepted; give a token or a client certificate and key"
	whyUnknown = "unknown field; only inline credentials are accepted"
)

type named struct {
	path string
	name string
	body map[string]any
}

type kubeconfig struct {
	p    Policy
	errs errList

	current                  string
	clusters, users, context []named
}

// walk checks every field of the document and keeps the named entries for resolve.
func (k *kubeconfig) walk(top map[string]any) {
	for _, key := range sortedKeys(top) {
		v := top[key]
		switch key {
		case "apiVersion", "kind":
			k.str(key, v)
		case "current-context":
			k.current = k.str(key, v)
		case "preferences", "extensions":
			// Data client-go passes on to no code once exec is refused: never interpreted.
		case "clusters":
			k.clusters = k.list(key, "cluster", v, k.cluster)
		case "users":
			k.users = k.list(key, "user", v, k.user)
		case "contexts":
			k.context = k.list(key, "context", v, k.ctx)
		default:
			k.errs.add(key, whyUnknown)
		}
	}
}

// list checks a list of {name, <inner>: {...}} entries, each body with check.
func (k *kubeconfig) list(field, inner string, v any, check func(path string, body map[string]any)) []named {
	if v == nil {
		return nil
	}
	items, ok := v.([]any)
	if !ok {
		k.errs.add(field, "want a list")
		return nil
	}
	var out []named
	seen := map[string]bool{}
	for i, it := range items {
		path := fmt.Sprintf("%s[%d]", field, i)
		m, ok := it.(map[string]any)
		if !ok {
			k.errs.add(path, "want a mapping")
			continue
		}
		e := named{path: path + "." + inner}
		for _, key := range sortedKeys(m) {
			switch key {
			case "name":
				e.name = k.str(path+".name", m[key])
			case inner:
				if m[key] == nil {
					continue
				}
				if e.body, ok = m[key].(map[string]any); !ok {
					k.errs.add(e.path, "want a mapping")
				}
			default:
				k.errs.add(path+"."+key, whyUnknown)
			}
		}
		if seen[e.name] {
			// client-go would pick one of them; which one must not be a guess.
			k.errs.add(path+".name", "duplicate name")
		}
		seen[e.name] = true
		check(e.path, e.body)
		out = append(out, e)
	}
	return out
}

func (k *kubeconfig) cluster(path string, c map[string]any) {
	for _, key := range sortedKeys(c) {
		f, v := path+"."+key, c[key]
		switch key {
		case "server", "tls-server-name":
			k.str(f, v)
		case "certificate-authority-data":
			k.data(f, v)
		case "disable-compression":
			k.boolean(f, v)
		case "insecure-skip-tls-verify":
			if k.boolean(f, v) {
				k.errs.add(f, "the hub verifies the member's API server; give certificate-authority-data")
			}
		case "proxy-url":
			s := k.str(f, v)
			if s == "" {
				continue
			}
			if u, err := url.Parse(s); err != nil || u.Host == "" || !slices.Contains([]string{"http", "https", "socks5"}, u.Scheme) {
				k.errs.add(f, "want an http, https or socks5 URL")
			} else if !k.p.proxyAllowed(u) {
				k.errs.add(f, "proxy %s is not in --credentials-allowed-proxies", u.Hostname())
			}
		case "certificate-authority":
			k.refuseSet(f, v, whyFile, "certificate-authority-data")
		case "extensions":
		default:
			k.errs.add(f, whyUnknown)
		}
	}
}

func (k *kubeconfig) user(path string, u map[string]any) {
	for _, key := range sortedKeys(u) {
		f, v := path+"."+key, u[key]
		switch key {
		case "token":
			k.str(f, v)
		case "client-certificate-data", "client-key-data":
			k.data(f, v)
		case "tokenFile":
			k.refuseSet(f, v, whyFile, "token")
		case "client-certificate":
			k.refuseSet(f, v, whyFile, "client-certificate-data")
		case "client-key":
			k.refuseSet(f, v, whyFile, "client-key-data")
		case "exec":
			k.refuseSet(f, v, whyExec)
		case "auth-provider":
			k.refuseSet(f, v, whyPlugin)
		case "as", "as-uid", "as-groups", "as-user-extra":
			k.refuseSet(f, v, whyImp)
		case "username", "password":
			k.refuseSet(f, v, whyBasic)
		case "extensions":
		default:
			k.errs.add(f, whyUnknown)
		}
	}
}

func (k *kubeconfig) ctx(path string, c map[string]any) {
	for _, key := range sortedKeys(c) {
		f, v := path+"."+key, c[key]
		switch key {
		case "cluster", "user", "namespace":
			k.str(f, v)
		case "extensions":
		default:
			k.errs.add(f, whyUnknown)
		}
	}
}

// refuseSet refuses a field that is set: present and not empty (null, "", false, [], {} are
// what client-go would treat as absent).
func (k *kubeconfig) refuseSet(field string, v any, why string, args ...any) {
	switch x := v.(type) {
	case nil:
		return
	case string:
		if x == "" {
			return
		}
	case bool:
		if !x {
			return
		}
	case []any:
		if len(x) == 0 {
			return
		}
	case map[string]any:
		if len(x) == 0 {
			return
		}
	}
	k.errs.add(field, why, args...)
}

func (k *kubeconfig) str(field string, v any) string {
	if v == nil {
		return ""
	}
	s, ok := v.(string)
	if !ok {
		k.errs.add(field, "want a string")
	}
	return s
}

func (k *kubeconfig) boolean(field string, v any) bool {
	if v == nil {
		return false
	}
	b, ok := v.(bool)
	if !ok {
		k.errs.add(field, "want true or false")
	}
	return b
}

func (k *kubeconfig) data(field string, v any) []byte {
	s := k.str(field, v)
	if s == "" {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		k.errs.add(field, "not base64")
	}
	return b
}

// resolve returns the credentials of the current context, every field already checked.
func (k *kubeconfig) resolve() *Credentials {
	var ctx *named
	switch {
	case k.current != "":
		if ctx = find(k.context, k.current); ctx == nil {
			k.errs.add("current-context", "names no context")
			return nil
		}
	case len(k.context) == 1:
		ctx = &k.context[0]
	default:
		k.errs.add("current-context", "required: the kubeconfig has %d contexts", len(k.context))
		return nil
	}
	cname, _ := ctx.body["cluster"].(string)
	uname, _ := ctx.body["user"].(string)
	cl, us := find(k.clusters, cname), find(k.users, uname)
	if cl == nil {
		k.errs.add(ctx.path+".cluster", "names no cluster")
	}
	if us == nil {
		k.errs.add(ctx.path+".user", "names no user: the credentials need a token or a client certificate")
	}
	if cl == nil || us == nil {
		return nil
	}
	c := &Credentials{}
	c.Server, _ = cl.body["server"].(string)
	c.TLSServerName, _ = cl.body["tls-server-name"].(string)
	c.DisableCompression, _ = cl.body["disable-compression"].(bool)
	c.CAData = k.data(cl.path+".certificate-authority-data", cl.body["certificate-authority-data"])
	if s, _ := cl.body["proxy-url"].(string); s != "" {
		c.ProxyURL, _ = url.Parse(s) // checked by walk
	}
	k.errs.server(cl.path+".server", c.Server)
	c.Token, _ = us.body["token"].(string)
	c.CertData = k.data(us.path+".client-certificate-data", us.body["client-certificate-data"])
	c.KeyData = k.data(us.path+".client-key-data", us.body["client-key-data"])
	k.errs.auth(us.path, c)
	return c
}

func find(list []named, name string) *named {
	for i := range list {
		if list[i].name == name {
			return &list[i]
		}
	}
	return nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// IsRefused reports whether err is a refusal of the credentials themselves (retrying the same
// credentials cannot succeed), not a failure to reach anything.
func IsRefused(err error) bool {
	var e *Error
	return errors.As(err, &e)
}
