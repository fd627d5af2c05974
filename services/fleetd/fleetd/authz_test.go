package fleetd_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// The callers of the authorization matrix. team-a owns namespace web on c1; team-b owns
// namespace shop on c1 and is owned by "other".
const (
	roleAdmin     = "admin"
	roleOwner     = "owner"
	roleMember    = "member"
	roleViewer    = "viewer"
	roleOther     = "other" // owner of another project
	roleNobody    = "nobody"
	roleAnonymous = "" // no token at all
)

var matrixCallers = []string{roleAdmin, roleOwner, roleMember, roleViewer, roleOther, roleNobody, roleAnonymous}

// Who may call: the least privileged caller that may, in the order of matrixCallers.
const (
	allowAdmin  = roleAdmin
	allowOwner  = roleOwner
	allowMember = roleMember
	allowViewer = roleViewer
	allowAnyone = roleNobody // every signed-in caller (filtered procedures answer with less)
)

// matrix is, for every procedure, a request aimed at team-a's scope and the least privileged
// caller allowed. Requests are chosen so that an allowed call changes nothing that later calls
// depend on (invalid arguments, unknown names, dry runs, a weight set to its default).
var matrix = map[string]struct {
	body  string
	allow string
}{
	"/fleetstream.cluster.v1.ClusterService/RegisterCluster":   {`{"name":"Not_A_Name"}`, allowAdmin},
	"/fleetstream.cluster.v1.ClusterService/UpdateCluster":     {`{"name":"no-such-cluster","labels":{"a":"b"},"updateMask":"labels"}`, allowAdmin},
	"/fleetstream.cluster.v1.ClusterService/DeregisterCluster": {`{"name":"no-such-cluster"}`, allowAdmin},
	"/fleetstream.cluster.v1.ClusterService/GetCluster":        {`{"name":"c1"}`, allowAnyone},
	"/fleetstream.cluster.v1.ClusterService/ListClusters":      {`{}`, allowAnyone},
	"/fleetstream.cluster.v1.ClusterService/WatchClusters":     {`{}`, allowAnyone},

	"/fleetstream.cluster.v1.SubscriberService/CreateSubscriber": {`{"name":"Not_A_Name"}`, allowAdmin},
	"/fleetstream.cluster.v1.SubscriberService/DeleteSubscriber": {`{"name":"no-such-subscriber"}`, allowAdmin},
	"/fleetstream.cluster.v1.SubscriberService/ListSubscribers":  {`{}`, allowAdmin},

	"/fleetstream.cluster.v1.ImportPolicyService/PreviewImportPolicy":  {`{"policy":{"name":"capi"},"sourceObject":"{}"}`, allowAdmin},
	"/fleetstream.cluster.v1.ImportPolicyService/CreateImportPolicy":   {`{"policy":{"name":"Not_A_Name"}}`, allowAdmin},
	"/fleetstream.cluster.v1.ImportPolicyService/UpdateImportPolicy":   {`{"policy":{"name":"Not_A_Name"}}`, allowAdmin},
	"/fleetstream.cluster.v1.ImportPolicyService/DeleteImportPolicy":   {`{"name":"no-such-policy"}`, allowAdmin},
	"/fleetstream.cluster.v1.ImportPolicyService/GetImportPolicy":      {`{"name":"no-such-policy"}`, allowAdmin},
	"/fleetstream.cluster.v1.ImportPolicyService/ListImportPolicies":   {`{}`, allowAdmin},
	"/fleetstream.cluster.v1.ImportPolicyService/ListImportLifecycles": {`{"policy":"no-such-policy"}`, allowAdmin},

	"/fleetstream.project.v1.ProjectService/CreateProject":         {`{"name":"Not_A_Name"}`, allowAdmin},
	"/fleetstream.project.v1.ProjectService/DeleteProject":         {`{"name":"no-such-project"}`, allowAdmin},
	"/fleetstream.project.v1.ProjectService/GetProject":            {`{"name":"team-a"}`, allowViewer},
	"/fleetstream.project.v1.ProjectService/ListProjects":          {`{}`, allowAnyone},
	"/fleetstream.project.v1.ProjectService/WatchProjects":         {`{}`, allowAnyone},
	"/fleetstream.project.v1.ProjectService/BindNamespace":         {`{"project":"team-a","cluster":"c1","namespace":"web2","hard":{"cpu":"lots"}}`, allowOwner},
	"/fleetstream.project.v1.ProjectService/UpdateQuota":           {`{"project":"team-a","cluster":"c1","namespace":"web","hard":{"cpu":"lots"}}`, allowOwner},
	"/fleetstream.project.v1.ProjectService/UnbindNamespace":       {`{"project":"team-a","cluster":"c1","namespace":"no-such-ns"}`, allowOwner},
	"/fleetstream.project.v1.ProjectService/ListNamespaceBindings": {`{}`, allowAnyone},
	"/fleetstream.project.v1.ProjectService/ListIdleNamespaces":    {`{"cluster":"c1"}`, allowAdmin},
	"/fleetstream.project.v1.ProjectService/SetProjectBudget":      {`{"project":"team-a","cluster":"c1","hard":{"cpu":"lots"}}`, allowAdmin},

	"/fleetstream.rbac.v1.RBACService/CreateRoleTemplate":      {`{"template":{"name":"Not_A_Name"}}`, allowAdmin},
	"/fleetstream.rbac.v1.RBACService/UpdateRoleTemplate":      {`{"template":{"name":"no-such-role","displayName":"x"},"updateMask":"displayName"}`, allowAdmin},
	"/fleetstream.rbac.v1.RBACService/DeleteRoleTemplate":      {`{"name":"no-such-role"}`, allowAdmin},
	"/fleetstream.rbac.v1.RBACService/GetRoleTemplate":         {`{"name":"project-viewer"}`, allowAnyone},
	"/fleetstream.rbac.v1.RBACService/ListRoleTemplates":       {`{}`, allowAnyone},
	"/fleetstream.rbac.v1.RBACService/BindProjectRole":         {`{"project":"team-a","subject":{"kind":"SUBJECT_KIND_USER","name":"zed"},"roleTemplate":"project-viewer","dryRun":true}`, allowOwner},
	"/fleetstream.rbac.v1.RBACService/UnbindProjectRole":       {`{"project":"team-a","subject":{"kind":"SUBJECT_KIND_USER","name":"zed"},"roleTemplate":"project-viewer","dryRun":true}`, allowOwner},
	"/fleetstream.rbac.v1.RBACService/ListProjectRoleBindings": {`{}`, allowAnyone},
	"/fleetstream.rbac.v1.RBACService/GetPropagationStatus":    {`{"binding":{"project":"team-a","subject":{"kind":"SUBJECT_KIND_USER","name":"viewer"},"roleTemplate":"project-viewer"}}`, allowViewer},
	"/fleetstream.rbac.v1.RBACService/WhoCan":                  {`{"cluster":"c1","namespace":"web"}`, allowViewer},
	"/fleetstream.rbac.v1.RBACService/AccessAt":                {`{"subject":{"kind":"SUBJECT_KIND_USER","name":"viewer"},"time":"2030-01-01T00:00:00Z"}`, allowAnyone},

	"/fleetstream.placement.v1.ClusterSetService/CreateClusterSet":       {`{"name":"Not_A_Name"}`, allowAdmin},
	"/fleetstream.placement.v1.ClusterSetService/UpdateClusterSet":       {`{"name":"no-such-set","selector":{"type":"SELECTOR_TYPE_EXCLUSIVE_LABEL"}}`, allowAdmin},
	"/fleetstream.placement.v1.ClusterSetService/DeleteClusterSet":       {`{"name":"no-such-set"}`, allowAdmin},
	"/fleetstream.placement.v1.ClusterSetService/GetClusterSet":          {`{"name":"default"}`, allowAnyone},
	"/fleetstream.placement.v1.ClusterSetService/ListClusterSets":        {`{}`, allowAnyone},
	"/fleetstream.placement.v1.ClusterSetService/BindClusterSet":         {`{"project":"no-such-project","clusterSet":"default"}`, allowAdmin},
	"/fleetstream.placement.v1.ClusterSetService/UnbindClusterSet":       {`{"project":"team-a","clusterSet":"no-such-set"}`, allowAdmin},
	"/fleetstream.placement.v1.ClusterSetService/ListClusterSetBindings": {`{}`, allowAnyone},
	// Set roles are bound per set: no caller of the matrix holds one (setroles_test.go has the
	// set admins and viewers), so only platform admins may bind them here.
	"/fleetstream.placement.v1.ClusterSetService/BindClusterSetRole":         {`{"clusterSet":"no-such-set","subject":{"kind":"SUBJECT_KIND_USER","name":"zed"},"role":"clusterset-view"}`, allowAdmin},
	"/fleetstream.placement.v1.ClusterSetService/UnbindClusterSetRole":       {`{"clusterSet":"no-such-set","subject":{"kind":"SUBJECT_KIND_USER","name":"zed"},"role":"clusterset-view"}`, allowAdmin},
	"/fleetstream.placement.v1.ClusterSetService/ListClusterSetRoleBindings": {`{}`, allowAnyone},

	"/fleetstream.placement.v1.PlacementService/CreatePlacement":         {`{"placement":{"project":"team-a","name":"Not_A_Name"}}`, allowOwner},
	"/fleetstream.placement.v1.PlacementService/UpdatePlacement":         {`{"placement":{"project":"team-a","name":"no-such-placement"}}`, allowOwner},
	"/fleetstream.placement.v1.PlacementService/DeletePlacement":         {`{"project":"team-a","name":"no-such-placement"}`, allowOwner},
	"/fleetstream.placement.v1.PlacementService/GetPlacement":            {`{"project":"team-a","name":"no-such-placement"}`, allowViewer},
	"/fleetstream.placement.v1.PlacementService/ListPlacements":          {`{}`, allowAnyone},
	"/fleetstream.placement.v1.PlacementService/GetPlacementDecisions":   {`{"project":"team-a","name":"no-such-placement"}`, allowViewer},
	"/fleetstream.placement.v1.PlacementService/WatchPlacementDecisions": {`{"project":"team-a","name":"no-such-placement"}`, allowViewer},
	"/fleetstream.placement.v1.PlacementService/ExplainPlacement":        {`{"project":"team-a","name":"no-such-placement"}`, allowViewer},
	"/fleetstream.placement.v1.PlacementService/SetAddOnScore":           {`{"cluster":"no-such-cluster","resourceName":"cost","scoreName":"cheap","score":1}`, allowAdmin},

	"/fleetstream.endpoint.v1.EndpointService/GetServiceEndpoints":   {`{"namespace":"web","name":"frontend"}`, allowViewer},
	"/fleetstream.endpoint.v1.EndpointService/WatchServiceEndpoints": {`{"namespace":"web","name":"frontend"}`, allowViewer},
	"/fleetstream.endpoint.v1.EndpointService/SetEndpointWeight":     {`{"namespace":"web","name":"frontend","ip":"10.0.0.1","cluster":"c1","weight":100}`, allowMember},
	"/fleetstream.endpoint.v1.EndpointService/SetClusterWeight":      {`{"namespace":"web","name":"frontend","cluster":"c1","weight":100}`, allowMember},
	"/fleetstream.endpoint.v1.EndpointService/ListServices":          {`{}`, allowAnyone},
	"/fleetstream.endpoint.v1.EndpointService/ListServiceWeights":    {`{}`, allowAnyone},

	// Asking for team-a's activity: its owners only (the handler refuses the others).
	"/fleetstream.audit.v1.AuditService/ListActivity": {`{"project":"team-a","pageSize":1}`, allowOwner},
}

// procedures lists every RPC of every Fleetstream service linked into fleetd, from the
// generated descriptors: an RPC added to proto/ shows up here without anyone listing it.
func procedures() map[string]protoreflect.MethodDescriptor {
	out := map[string]protoreflect.MethodDescriptor{}
	protoregistry.GlobalFiles.RangeFiles(func(f protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(f.Package()), "fleetstream.") {
			return true
		}
		for i := 0; i < f.Services().Len(); i++ {
			s := f.Services().Get(i)
			for j := 0; j < s.Methods().Len(); j++ {
				m := s.Methods().Get(j)
				out["/"+string(s.FullName())+"/"+string(m.Name())] = m
			}
		}
		return true
	})
	return out
}

func TestEveryProcedureHasARule(t *testing.T) {
	procs := procedures()
	if len(procs) < 30 {
		t.Fatalf("found only %d procedures: are the generated packages linked?", len(procs))
	}
	for p := range procs {
		if _, ok := authz.Lookup(p); !ok {
			t.Errorf("%s has no row in pkg/authz's table", p)
		}
		if _, ok := matrix[p]; !ok {
			t.Errorf("%s has no row in this test's matrix", p)
		}
	}
}

// docs/security.md renders the table for people: every procedure has its row there too.
func TestSecurityDocListsEveryProcedure(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	for p := range procedures() {
		short := p[strings.LastIndex(p[:strings.LastIndex(p, "/")], ".")+1:] // Service/Method
		if !strings.Contains(string(doc), "| "+short+" |") {
			t.Errorf("docs/security.md has no row for %s", short)
		}
	}
}

// startTenants starts fleetd (real JetStream, real services) with one token per caller of the
// matrix, platform admin "admin", groups "platform-ops" (admins) and "team-a-devs" (members of
// team-a through a group binding), and the projects, namespaces and grants the matrix assumes.
func startTenants(t *testing.T) *rawClient {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	var lines []string
	for _, c := range matrixCallers {
		if c != roleAnonymous {
			lines = append(lines, "token-"+c+","+c)
		}
	}
	lines = append(lines, `token-ops,ops,uid-ops,"platform-ops"`, `token-dev,dev,uid-dev,"team-a-devs,others"`,
		"token-"+roleXDSReader+","+roleXDSReader)
	// The holders of cluster set roles (setroles_test.go); none holds any role until granted.
	lines = append(lines, "token-"+setAdminA+","+setAdminA, "token-"+setAdminB+","+setAdminB,
		"token-"+setViewerA+","+setViewerA+",uid-"+setViewerA+`,"`+setViewersGroup+`"`)
	if err := os.WriteFile(tokens, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inst, err := fleetd.Start(ctx, fleetd.Config{
		DataDir:    filepath.Join(dir, "data"),
		Server:     server.Config{Listen: "127.0.0.1:0", TokenFile: tokens},
		NATSListen: "127.0.0.1:0",
		XDSListen:  "127.0.0.1:0",
		Authz: authz.Config{PlatformAdmins: []string{roleAdmin}, PlatformAdminGroups: []string{"platform-ops"},
			XDSReaders: []string{roleXDSReader}},
		// No credentials are stored here; sealing them is tested in cluster-import.
		ClusterImport: clusterimport.Config{PlaintextCredentials: true},
	}, testkit.Logger(t))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); inst.Stop() })
	select {
	case <-inst.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("fleetd not ready")
	}
	api := &rawClient{base: "http://" + inst.Addr, xds: inst.XDSAddr}
	mustOK := func(proc, body string) {
		t.Helper()
		if code := api.call(t, roleAdmin, proc, body); code != "" {
			t.Fatalf("setup %s %s: %s", proc, body, code)
		}
	}
	mustOK("/fleetstream.cluster.v1.ClusterService/RegisterCluster", `{"name":"c1"}`)
	for _, p := range []string{"team-a", "team-b"} {
		mustOK("/fleetstream.project.v1.ProjectService/CreateProject", `{"name":"`+p+`"}`)
	}
	mustOK("/fleetstream.project.v1.ProjectService/BindNamespace", `{"project":"team-a","cluster":"c1","namespace":"web"}`)
	mustOK("/fleetstream.project.v1.ProjectService/BindNamespace", `{"project":"team-b","cluster":"c1","namespace":"shop"}`)
	for user, grant := range map[string]string{roleOwner: "team-a/project-owner", roleMember: "team-a/project-member",
		roleViewer: "team-a/project-viewer", roleOther: "team-b/project-owner"} {
		project, role, _ := strings.Cut(grant, "/")
		mustOK("/fleetstream.rbac.v1.RBACService/BindProjectRole",
			fmt.Sprintf(`{"project":%q,"subject":{"kind":"SUBJECT_KIND_USER","name":%q},"roleTemplate":%q}`, project, user, role))
	}
	// The grants are read through the authorizer's mirrors: wait until they show.
	testkit.Eventually(t, 10*time.Second, func() error {
		if code := api.call(t, roleViewer, "/fleetstream.project.v1.ProjectService/GetProject", `{"name":"team-a"}`); code != "" {
			return fmt.Errorf("viewer gets team-a: %q", code)
		}
		if code := api.call(t, roleOther, "/fleetstream.project.v1.ProjectService/GetProject", `{"name":"team-b"}`); code != "" {
			return fmt.Errorf("team-b's owner gets team-b: %q", code)
		}
		return nil
	})
	return api
}

// TestAuthorizationMatrix calls every procedure as every kind of caller and checks who is let
// through.
func TestAuthorizationMatrix(t *testing.T) {
	api := startTenants(t)

	procs := procedures()
	for _, proc := range slices.Sorted(maps.Keys(procs)) {
		row, ok := matrix[proc]
		if !ok {
			continue // reported by TestEveryProcedureHasARule
		}
		limit := slices.Index(matrixCallers, row.allow)
		for i, caller := range matrixCallers {
			name := caller
			if name == "" {
				name = "anonymous"
			}
			t.Run(strings.TrimPrefix(proc, "/fleetstream.")+"/"+name, func(t *testing.T) {
				code := api.callMethod(t, caller, proc, row.body, procs[proc].IsStreamingServer())
				switch {
				case caller == roleAnonymous:
					if code != "unauthenticated" {
						t.Fatalf("without a token: %q, want unauthenticated", code)
					}
				case i <= limit:
					if code == "permission_denied" || code == "unauthenticated" {
						t.Fatalf("%s refused: %s (allowed from %s up)", name, code, row.allow)
					}
				default:
					if code != "permission_denied" {
						t.Fatalf("%s got %q, want permission_denied (only %s and above)", name, code, row.allow)
					}
				}
			})
		}
	}
}

// rawClient speaks the Connect protocol with JSON bodies, so one loop can call every procedure
// without a typed client per service.
type rawClient struct {
	base string
	xds  string // the xDS listener (gRPC)
}

func (c *rawClient) call(t *testing.T, caller, proc, body string) string {
	code, _ := c.callFull(t, caller, proc, body)
	return code
}

// callFull makes a unary call and returns the error code ("" on success) and the whole body.
func (c *rawClient) callFull(t *testing.T, caller, proc, body string) (string, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.base+proc, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if caller != roleAnonymous {
		req.Header.Set("Authorization", "Bearer token-"+caller)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", proc, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode == http.StatusOK {
		return "", data
	}
	var e struct {
		Code string `json:"code"`
	}
	if err := json.Unmarshal(data, &e); err != nil || e.Code == "" {
		t.Fatalf("%s: HTTP %d with %.200q", proc, res.StatusCode, data)
	}
	return e.Code, data
}

// callMethod returns "" on success, else the Connect error code. A server stream that is still
// open after a moment without an error counts as success (a watch runs until cancelled).
func (c *rawClient) callMethod(t *testing.T, caller, proc, body string, streaming bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	payload := []byte(body)
	ctype := "application/json"
	if streaming {
		var env bytes.Buffer
		env.WriteByte(0)
		_ = binary.Write(&env, binary.BigEndian, uint32(len(payload)))
		env.Write(payload)
		payload, ctype = env.Bytes(), "application/connect+json"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+proc, bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ctype)
	if caller != roleAnonymous {
		req.Header.Set("Authorization", "Bearer token-"+caller)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		if streaming && ctx.Err() != nil {
			return "" // a watch with nothing to send yet: let through, still open
		}
		t.Fatalf("%s: %v", proc, err)
	}
	defer res.Body.Close()
	var e struct {
		Code  string `json:"code"`
		Error *struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if !streaming {
		if res.StatusCode == http.StatusOK {
			return ""
		}
		data, _ := io.ReadAll(res.Body)
		if err := json.Unmarshal(data, &e); err != nil || e.Code == "" {
			t.Fatalf("%s: HTTP %d with %q", proc, res.StatusCode, data)
		}
		return e.Code
	}
	// The first frame tells: a message means the call was let through, an end-of-stream frame
	// carries the error if there is one.
	var hdr [5]byte
	if _, err := io.ReadFull(res.Body, hdr[:]); err != nil {
		if ctx.Err() != nil {
			return "" // still open: a running watch
		}
		t.Fatalf("%s: stream ended without end message: %v", proc, err)
	}
	msg := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
	if _, err := io.ReadFull(res.Body, msg); err != nil {
		if ctx.Err() != nil {
			return ""
		}
		t.Fatalf("%s: %v", proc, err)
	}
	if hdr[0]&0x02 == 0 {
		return ""
	}
	if err := json.Unmarshal(msg, &e); err != nil {
		t.Fatalf("%s: end message %q: %v", proc, msg, err)
	}
	if e.Error == nil {
		return ""
	}
	return e.Error.Code
}

// TestAuthorizationOfDryRuns: a write's dry run is authorized as the write is (the same
// procedure, the same rule): each caller below the write's least privileged one is refused,
// each other caller gets the write's decision, and nothing is written (the listing an admin
// reads is the same, revisions included, before and after every caller's dry run).
func TestAuthorizationOfDryRuns(t *testing.T) {
	api := startTenants(t)
	// A cluster where no project holds a namespace: a budget there holds whatever the
	// namespaces' quotas (on c1, web and shop have none, and a budget of a resource is refused
	// while a namespace of the project lacks a limit of it). So the budget's dry run is a real
	// write the admin is told would succeed, and one the probe would see if it were made.
	if code := api.call(t, roleAdmin, "/fleetstream.cluster.v1.ClusterService/RegisterCluster", `{"name":"c2"}`); code != "" {
		t.Fatalf("register c2: %s", code)
	}
	const (
		clusters   = "/fleetstream.cluster.v1.ClusterService/ListClusters"
		projects   = "/fleetstream.project.v1.ProjectService/ListProjects"
		namespaces = "/fleetstream.project.v1.ProjectService/ListNamespaceBindings"
	)
	rows := []struct {
		proc, body, allow, probe string
	}{
		{"/fleetstream.cluster.v1.ClusterService/RegisterCluster", `{"name":"dry-c"}`, allowAdmin, clusters},
		{"/fleetstream.cluster.v1.ClusterService/UpdateCluster", `{"name":"c1","labels":{"dry":"run"},"updateMask":"labels"}`, allowAdmin, clusters},
		{"/fleetstream.cluster.v1.ClusterService/DeregisterCluster", `{"name":"c1"}`, allowAdmin, clusters},
		{"/fleetstream.cluster.v1.SubscriberService/CreateSubscriber", `{"name":"dry-s","streams":["FLEET_NS"]}`, allowAdmin, "/fleetstream.cluster.v1.SubscriberService/ListSubscribers"},
		{"/fleetstream.project.v1.ProjectService/CreateProject", `{"name":"dry-p"}`, allowAdmin, projects},
		{"/fleetstream.project.v1.ProjectService/SetProjectBudget", `{"project":"team-a","cluster":"c2","hard":{"cpu":"4"}}`, allowAdmin, projects},
		{"/fleetstream.project.v1.ProjectService/DeleteProject", `{"name":"team-b","force":true}`, allowAdmin, namespaces},
		{"/fleetstream.project.v1.ProjectService/BindNamespace", `{"project":"team-a","cluster":"c1","namespace":"web2","hard":{"cpu":"1"}}`, allowOwner, namespaces},
		{"/fleetstream.project.v1.ProjectService/UpdateQuota", `{"project":"team-a","cluster":"c1","namespace":"web","hard":{"cpu":"1"}}`, allowOwner, namespaces},
		{"/fleetstream.project.v1.ProjectService/UnbindNamespace", `{"project":"team-a","cluster":"c1","namespace":"web"}`, allowOwner, namespaces},
		{"/fleetstream.rbac.v1.RBACService/CreateRoleTemplate", `{"template":{"name":"dry-role","rules":[{"verbs":["get"],"apiGroups":[""],"resources":["pods"]}]}}`, allowAdmin, "/fleetstream.rbac.v1.RBACService/ListRoleTemplates"},
		{"/fleetstream.placement.v1.ClusterSetService/CreateClusterSet", `{"name":"dry-set","selector":{"type":"SELECTOR_TYPE_LABEL_SELECTOR","labelSelector":{}}}`, allowAdmin, "/fleetstream.placement.v1.ClusterSetService/ListClusterSets"},
		{"/fleetstream.placement.v1.ClusterSetService/BindClusterSet", `{"project":"team-a","clusterSet":"global"}`, allowAdmin, "/fleetstream.placement.v1.ClusterSetService/ListClusterSetBindings"},
		{"/fleetstream.placement.v1.PlacementService/CreatePlacement", `{"placement":{"project":"team-a","name":"dry-pl","numberOfClusters":1}}`, allowOwner, "/fleetstream.placement.v1.PlacementService/ListPlacements"},
		{"/fleetstream.endpoint.v1.EndpointService/SetClusterWeight", `{"namespace":"web","name":"frontend","cluster":"c1","weight":50}`, allowMember, "/fleetstream.endpoint.v1.EndpointService/ListServiceWeights"},
	}
	// What the dry run answers the admin, where the test looks at it: what the write would do.
	answers := map[string]string{
		"/fleetstream.project.v1.ProjectService/SetProjectBudget": `"budgets":[{"cluster":"c2","hard":{"cpu":"4"}`,
	}
	for _, row := range rows {
		t.Run(strings.TrimPrefix(row.proc, "/fleetstream."), func(t *testing.T) {
			body := strings.TrimSuffix(row.body, "}") + `,"dryRun":true}`
			probe := func() string {
				code, data := api.callFull(t, roleAdmin, row.probe, `{}`)
				if code != "" {
					t.Fatalf("%s: %s", row.probe, code)
				}
				return string(data)
			}
			before := probe()
			limit := slices.Index(matrixCallers, row.allow)
			for i, caller := range matrixCallers {
				code, data := api.callFull(t, caller, row.proc, body)
				if want := answers[row.proc]; caller == roleAdmin && want != "" {
					var compact bytes.Buffer
					if err := json.Compact(&compact, data); err != nil || !strings.Contains(compact.String(), want) {
						t.Errorf("dry run as %s answers %s, want it to hold %s", caller, data, want)
					}
				}
				switch {
				case caller == roleAnonymous:
					if code != "unauthenticated" {
						t.Errorf("dry run without a token: %q, want unauthenticated", code)
					}
				case i <= limit:
					if code != "" {
						t.Errorf("dry run as %s: %q, want the write's decision (allowed from %s up)", caller, code, row.allow)
					}
				default:
					if code != "permission_denied" {
						t.Errorf("dry run as %s: %q, want permission_denied as for the write (only %s and above)", caller, code, row.allow)
					}
				}
			}
			if after := probe(); after != before {
				t.Errorf("a dry run of %s wrote: %s answered\n%s\nbefore, and now\n%s", row.proc, row.probe, before, after)
			}
		})
	}
}
