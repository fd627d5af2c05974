package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1/auditv1connect"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
)

// fakeToken is the bearer token fakeAPI accepts.
const fakeToken = "fake-t0ken"

// fakeAPI serves every method fleetctl calls with canned answers and records what it was sent,
// so a command's flags (what reaches the server) and its output (what it makes of the answer)
// are tested in milliseconds, without the real services the end-to-end tests run. What the
// services do is their own tests' business; here the server is only as real as the wire.
type fakeAPI struct {
	url string

	mu sync.Mutex
	// answers holds the responses of a test: a unary method answers with the first of its
	// response type (an empty one when there is none), a stream sends all of its type.
	answers []proto.Message
	// err, when set, is every method's answer.
	err error
	// hold keeps a stream open after its answers until the client goes away; otherwise the
	// server ends it, which a watch reports.
	hold bool
	// requests are what the methods were sent, in order.
	requests []fakeRequest
}

type fakeRequest struct {
	procedure string
	msg       proto.Message
}

func startFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	a := &fakeAPI{}
	mux := http.NewServeMux()
	fakeUnary[clusterv1.DeregisterClusterRequest, clusterv1.DeregisterClusterResponse](mux, a, clusterv1connect.ClusterServiceDeregisterClusterProcedure)
	fakeUnary[clusterv1.GetClusterRequest, clusterv1.GetClusterResponse](mux, a, clusterv1connect.ClusterServiceGetClusterProcedure)
	fakeUnary[clusterv1.ListClustersRequest, clusterv1.ListClustersResponse](mux, a, clusterv1connect.ClusterServiceListClustersProcedure)
	fakeUnary[clusterv1.RegisterClusterRequest, clusterv1.RegisterClusterResponse](mux, a, clusterv1connect.ClusterServiceRegisterClusterProcedure)
	fakeUnary[clusterv1.UpdateClusterRequest, clusterv1.UpdateClusterResponse](mux, a, clusterv1connect.ClusterServiceUpdateClusterProcedure)
	fakeStream[clusterv1.WatchClustersRequest, clusterv1.WatchClustersResponse](mux, a, clusterv1connect.ClusterServiceWatchClustersProcedure)
	fakeUnary[clusterv1.CreateImportPolicyRequest, clusterv1.CreateImportPolicyResponse](mux, a, clusterv1connect.ImportPolicyServiceCreateImportPolicyProcedure)
	fakeUnary[clusterv1.DeleteImportPolicyRequest, clusterv1.DeleteImportPolicyResponse](mux, a, clusterv1connect.ImportPolicyServiceDeleteImportPolicyProcedure)
	fakeUnary[clusterv1.GetImportPolicyRequest, clusterv1.GetImportPolicyResponse](mux, a, clusterv1connect.ImportPolicyServiceGetImportPolicyProcedure)
	fakeUnary[clusterv1.ListImportLifecyclesRequest, clusterv1.ListImportLifecyclesResponse](mux, a, clusterv1connect.ImportPolicyServiceListImportLifecyclesProcedure)
	fakeUnary[clusterv1.ListImportPoliciesRequest, clusterv1.ListImportPoliciesResponse](mux, a, clusterv1connect.ImportPolicyServiceListImportPoliciesProcedure)
	fakeUnary[clusterv1.PreviewImportPolicyRequest, clusterv1.PreviewImportPolicyResponse](mux, a, clusterv1connect.ImportPolicyServicePreviewImportPolicyProcedure)
	fakeUnary[endpointv1.GetServiceEndpointsRequest, endpointv1.GetServiceEndpointsResponse](mux, a, endpointv1connect.EndpointServiceGetServiceEndpointsProcedure)
	fakeUnary[endpointv1.ListServicesRequest, endpointv1.ListServicesResponse](mux, a, endpointv1connect.EndpointServiceListServicesProcedure)
	fakeUnary[endpointv1.SetClusterWeightRequest, endpointv1.SetClusterWeightResponse](mux, a, endpointv1connect.EndpointServiceSetClusterWeightProcedure)
	fakeUnary[endpointv1.SetEndpointWeightRequest, endpointv1.SetEndpointWeightResponse](mux, a, endpointv1connect.EndpointServiceSetEndpointWeightProcedure)
	fakeStream[endpointv1.WatchServiceEndpointsRequest, endpointv1.WatchServiceEndpointsResponse](mux, a, endpointv1connect.EndpointServiceWatchServiceEndpointsProcedure)
	fakeUnary[placementv1.BindClusterSetRequest, placementv1.BindClusterSetResponse](mux, a, placementv1connect.ClusterSetServiceBindClusterSetProcedure)
	fakeUnary[placementv1.BindClusterSetRoleRequest, placementv1.BindClusterSetRoleResponse](mux, a, placementv1connect.ClusterSetServiceBindClusterSetRoleProcedure)
	fakeUnary[placementv1.CreateClusterSetRequest, placementv1.CreateClusterSetResponse](mux, a, placementv1connect.ClusterSetServiceCreateClusterSetProcedure)
	fakeUnary[placementv1.DeleteClusterSetRequest, placementv1.DeleteClusterSetResponse](mux, a, placementv1connect.ClusterSetServiceDeleteClusterSetProcedure)
	fakeUnary[placementv1.GetClusterSetRequest, placementv1.GetClusterSetResponse](mux, a, placementv1connect.ClusterSetServiceGetClusterSetProcedure)
	fakeUnary[placementv1.ListClusterSetBindingsRequest, placementv1.ListClusterSetBindingsResponse](mux, a, placementv1connect.ClusterSetServiceListClusterSetBindingsProcedure)
	fakeUnary[placementv1.ListClusterSetRoleBindingsRequest, placementv1.ListClusterSetRoleBindingsResponse](mux, a, placementv1connect.ClusterSetServiceListClusterSetRoleBindingsProcedure)
	fakeUnary[placementv1.ListClusterSetsRequest, placementv1.ListClusterSetsResponse](mux, a, placementv1connect.ClusterSetServiceListClusterSetsProcedure)
	fakeUnary[placementv1.UnbindClusterSetRequest, placementv1.UnbindClusterSetResponse](mux, a, placementv1connect.ClusterSetServiceUnbindClusterSetProcedure)
	fakeUnary[placementv1.UnbindClusterSetRoleRequest, placementv1.UnbindClusterSetRoleResponse](mux, a, placementv1connect.ClusterSetServiceUnbindClusterSetRoleProcedure)
	fakeUnary[placementv1.CreatePlacementRequest, placementv1.CreatePlacementResponse](mux, a, placementv1connect.PlacementServiceCreatePlacementProcedure)
	fakeUnary[placementv1.DeletePlacementRequest, placementv1.DeletePlacementResponse](mux, a, placementv1connect.PlacementServiceDeletePlacementProcedure)
	fakeUnary[placementv1.GetPlacementRequest, placementv1.GetPlacementResponse](mux, a, placementv1connect.PlacementServiceGetPlacementProcedure)
	fakeUnary[placementv1.GetPlacementDecisionsRequest, placementv1.GetPlacementDecisionsResponse](mux, a, placementv1connect.PlacementServiceGetPlacementDecisionsProcedure)
	fakeUnary[placementv1.ExplainPlacementRequest, placementv1.ExplainPlacementResponse](mux, a, placementv1connect.PlacementServiceExplainPlacementProcedure)
	fakeUnary[placementv1.ListPlacementsRequest, placementv1.ListPlacementsResponse](mux, a, placementv1connect.PlacementServiceListPlacementsProcedure)
	fakeUnary[placementv1.SetAddOnScoreRequest, placementv1.SetAddOnScoreResponse](mux, a, placementv1connect.PlacementServiceSetAddOnScoreProcedure)
	fakeUnary[placementv1.UpdatePlacementRequest, placementv1.UpdatePlacementResponse](mux, a, placementv1connect.PlacementServiceUpdatePlacementProcedure)
	fakeStream[placementv1.WatchPlacementDecisionsRequest, placementv1.WatchPlacementDecisionsResponse](mux, a, placementv1connect.PlacementServiceWatchPlacementDecisionsProcedure)
	fakeUnary[projectv1.BindNamespaceRequest, projectv1.BindNamespaceResponse](mux, a, projectv1connect.ProjectServiceBindNamespaceProcedure)
	fakeUnary[projectv1.CreateProjectRequest, projectv1.CreateProjectResponse](mux, a, projectv1connect.ProjectServiceCreateProjectProcedure)
	fakeUnary[projectv1.DeleteProjectRequest, projectv1.DeleteProjectResponse](mux, a, projectv1connect.ProjectServiceDeleteProjectProcedure)
	fakeUnary[projectv1.GetProjectRequest, projectv1.GetProjectResponse](mux, a, projectv1connect.ProjectServiceGetProjectProcedure)
	fakeUnary[projectv1.ListIdleNamespacesRequest, projectv1.ListIdleNamespacesResponse](mux, a, projectv1connect.ProjectServiceListIdleNamespacesProcedure)
	fakeUnary[projectv1.ListNamespaceBindingsRequest, projectv1.ListNamespaceBindingsResponse](mux, a, projectv1connect.ProjectServiceListNamespaceBindingsProcedure)
	fakeUnary[projectv1.ListProjectsRequest, projectv1.ListProjectsResponse](mux, a, projectv1connect.ProjectServiceListProjectsProcedure)
	fakeUnary[projectv1.SetProjectBudgetRequest, projectv1.SetProjectBudgetResponse](mux, a, projectv1connect.ProjectServiceSetProjectBudgetProcedure)
	fakeUnary[projectv1.UnbindNamespaceRequest, projectv1.UnbindNamespaceResponse](mux, a, projectv1connect.ProjectServiceUnbindNamespaceProcedure)
	fakeUnary[projectv1.UpdateQuotaRequest, projectv1.UpdateQuotaResponse](mux, a, projectv1connect.ProjectServiceUpdateQuotaProcedure)
	fakeUnary[rbacv1.AccessAtRequest, rbacv1.AccessAtResponse](mux, a, rbacv1connect.RBACServiceAccessAtProcedure)
	fakePaged[auditv1.ListActivityRequest, auditv1.ListActivityResponse](mux, a, auditv1connect.AuditServiceListActivityProcedure)
	fakeUnary[rbacv1.BindProjectRoleRequest, rbacv1.BindProjectRoleResponse](mux, a, rbacv1connect.RBACServiceBindProjectRoleProcedure)
	fakeUnary[rbacv1.CreateRoleTemplateRequest, rbacv1.CreateRoleTemplateResponse](mux, a, rbacv1connect.RBACServiceCreateRoleTemplateProcedure)
	fakeUnary[rbacv1.DeleteRoleTemplateRequest, rbacv1.DeleteRoleTemplateResponse](mux, a, rbacv1connect.RBACServiceDeleteRoleTemplateProcedure)
	fakeUnary[rbacv1.GetPropagationStatusRequest, rbacv1.GetPropagationStatusResponse](mux, a, rbacv1connect.RBACServiceGetPropagationStatusProcedure)
	fakeUnary[rbacv1.GetRoleTemplateRequest, rbacv1.GetRoleTemplateResponse](mux, a, rbacv1connect.RBACServiceGetRoleTemplateProcedure)
	fakeUnary[rbacv1.ListProjectRoleBindingsRequest, rbacv1.ListProjectRoleBindingsResponse](mux, a, rbacv1connect.RBACServiceListProjectRoleBindingsProcedure)
	fakeUnary[rbacv1.ListRoleTemplatesRequest, rbacv1.ListRoleTemplatesResponse](mux, a, rbacv1connect.RBACServiceListRoleTemplatesProcedure)
	fakeUnary[rbacv1.UnbindProjectRoleRequest, rbacv1.UnbindProjectRoleResponse](mux, a, rbacv1connect.RBACServiceUnbindProjectRoleProcedure)
	fakeUnary[rbacv1.UpdateRoleTemplateRequest, rbacv1.UpdateRoleTemplateResponse](mux, a, rbacv1connect.RBACServiceUpdateRoleTemplateProcedure)
	fakeUnary[rbacv1.WhoCanRequest, rbacv1.WhoCanResponse](mux, a, rbacv1connect.RBACServiceWhoCanProcedure)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

// reset sets the answers of the next command and forgets what was sent.
func (a *fakeAPI) reset(answers []proto.Message, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answers, a.err, a.requests, a.hold = answers, err, nil, false
}

// holdStreams sets whether streams stay open after their answers.
func (a *fakeAPI) holdStreams(hold bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hold = hold
}

// sent returns the requests since the last reset.
func (a *fakeAPI) sent() []fakeRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]fakeRequest(nil), a.requests...)
}

// receive records a request and checks its token, as the real server's authentication does.
func (a *fakeAPI) receive(procedure string, h http.Header, msg proto.Message) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests = append(a.requests, fakeRequest{procedure: procedure, msg: msg})
	if h.Get("Authorization") != "Bearer "+fakeToken {
		return connect.NewError(connect.CodeUnauthenticated, nil)
	}
	return a.err
}

// answersOf returns the answers of type *T.
func answersOf[T any](a *fakeAPI) []*T {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*T
	for _, m := range a.answers {
		if _, ok := any(m).(*T); ok {
			out = append(out, any(proto.Clone(m)).(*T))
		}
	}
	return out
}

func fakeUnary[Req, Resp any](mux *http.ServeMux, a *fakeAPI, procedure string) {
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, func(_ context.Context, req *connect.Request[Req]) (*connect.Response[Resp], error) {
		if err := a.receive(procedure, req.Header(), any(req.Msg).(proto.Message)); err != nil {
			return nil, err
		}
		if answers := answersOf[Resp](a); len(answers) > 0 {
			return connect.NewResponse(answers[0]), nil
		}
		return connect.NewResponse(new(Resp)), nil
	}))
}

// fakePaged answers a paged list: the n-th call of the procedure gets the n-th answer of its
// type (the last one once they run out), so a command reading page after page is shown.
func fakePaged[Req, Resp any](mux *http.ServeMux, a *fakeAPI, procedure string) {
	mux.Handle(procedure, connect.NewUnaryHandler(procedure, func(_ context.Context, req *connect.Request[Req]) (*connect.Response[Resp], error) {
		if err := a.receive(procedure, req.Header(), any(req.Msg).(proto.Message)); err != nil {
			return nil, err
		}
		a.mu.Lock()
		calls := 0
		for _, r := range a.requests {
			if r.procedure == procedure {
				calls++
			}
		}
		a.mu.Unlock()
		if answers := answersOf[Resp](a); len(answers) > 0 {
			return connect.NewResponse(answers[min(calls, len(answers))-1]), nil
		}
		return connect.NewResponse(new(Resp)), nil
	}))
}

// fakeStream sends the stream's answers, then ends the stream (which a watch reports as the
// server closing it) or, with hold, waits for the client to end it.
func fakeStream[Req, Resp any](mux *http.ServeMux, a *fakeAPI, procedure string) {
	mux.Handle(procedure, connect.NewServerStreamHandler(procedure, func(ctx context.Context, req *connect.Request[Req], stream *connect.ServerStream[Resp]) error {
		if err := a.receive(procedure, req.Header(), any(req.Msg).(proto.Message)); err != nil {
			return err
		}
		answers := answersOf[Resp](a)
		for _, m := range answers {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
		a.mu.Lock()
		hold := a.hold
		a.mu.Unlock()
		if hold {
			// An error rather than a clean end: ended cleanly, the stream would read as
			// the server closing it should the client see the end before its own deadline.
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}))
}

// canonicalJSON renders a request for a golden file. protojson varies its whitespace on
// purpose; compacting and indenting makes it stable.
func canonicalJSON(t *testing.T, m proto.Message) string {
	t.Helper()
	data, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		t.Fatal(err)
	}
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		t.Fatal(err)
	}
	return out.String()
}
