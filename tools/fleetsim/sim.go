package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/authz"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/logging"
	"github.com/fleetstream/fleetstream/pkg/paging"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// apiWorkers bounds the API calls in flight at once (registrations, namespace bindings).
const apiWorkers = 8

// Result is what fleetsim prints. Durations are in milliseconds.
type Result struct {
	// Started is when the run began (UTC, RFC 3339).
	Started              string           `json:"started"`
	Hub                  string           `json:"hub"`
	Clusters             int              `json:"clusters"`
	NamespacesPerCluster int              `json:"namespaces_per_cluster"`
	HeartbeatMS          float64          `json:"heartbeat_ms"`
	Ramp                 float64          `json:"ramp_per_second"`
	Join                 *JoinResult      `json:"join,omitempty"`
	Grant                *GrantResult     `json:"grant,omitempty"`
	Steady               *SteadyResult    `json:"steady,omitempty"`
	Storm                *StormResult     `json:"storm,omitempty"`
	Placement            *PlacementResult `json:"placement,omitempty"`
	Endpoints            *EndpointsResult `json:"endpoints,omitempty"`
	// Propagation is the hub's own propagation histogram at the end, by kind (propagation.go).
	Propagation []PropagationResult `json:"propagation,omitempty"`
	// Misbehaving is what became of the -misbehave clusters, per kind.
	Misbehaving []MisbehaviourResult `json:"misbehaving,omitempty"`
	// JetStream consumers after the scenarios (embedded hub only): in total, and on the stream
	// that holds the most.
	Consumers          int    `json:"jetstream_consumers,omitempty"`
	MaxConsumers       int    `json:"max_consumers_per_stream,omitempty"`
	MaxConsumersStream string `json:"max_consumers_stream,omitempty"`
	// RSSMB is this process's resident memory: with -embedded, the hub and every simulated
	// agent together.
	RSSMB      float64 `json:"process_rss_mb"`
	Goroutines int     `json:"goroutines"`
	// Lost lists what never completed (a cluster never Connected, a RoleBinding never applied
	// or never removed); fleetsim fails when it is not empty.
	Lost []string `json:"lost,omitempty"`
	// HubError says why the embedded hub stopped during the run, if it did.
	HubError string `json:"hub_error,omitempty"`
	// Warnings are API answers that did not stop the scenario, e.g. a change accepted but not
	// yet visible within the call's patience.
	Warnings []string `json:"warnings,omitempty"`
}

// JoinResult is the join scenario: every cluster registered through the API, its agent
// connected, until ListClusters shows all of them Connected.
type JoinResult struct {
	Register Dist `json:"register"`
	// Connected is, per cluster, from its registration call until the hub showed it Connected
	// (seen on a WatchClusters stream).
	Connected Dist `json:"connected"`
	// NATSConnected is, per cluster, from its registration call until its agent's NATS
	// connection was accepted (authenticated by the hub's auth callout).
	NATSConnected Dist `json:"nats_connected"`
	// AllConnectedMS is from the first registration until every cluster was Connected.
	AllConnectedMS float64 `json:"all_connected_ms"`
	// RegisterRetries counts registration calls that timed out or found the hub unavailable and
	// were made again (Register times the one that succeeded).
	RegisterRetries int64 `json:"register_retries"`
}

// GrantResult is the grant scenario: a project namespace bound on every cluster, then rounds
// of a project role binding granted and revoked.
type GrantResult struct {
	// BindAllAppliedMS is from the first BindNamespace call until every cluster applied the
	// namespace.
	BindAllAppliedMS float64 `json:"bind_all_applied_ms"`
	// Grant and Revoke are, per cluster and round, from the API call until that cluster's
	// agent applied (deleted) the RoleBinding in its fake apiserver.
	Grant Dist `json:"grant"`
	// Measured is how many clusters the rounds were measured on: the lost ones are left out.
	Measured int          `json:"measured_clusters"`
	Revoke   Dist         `json:"revoke"`
	Rounds   []GrantRound `json:"rounds"`
}

// GrantRound is one round: until the last cluster applied (removed) the RoleBinding.
type GrantRound struct {
	GrantAllMS  float64 `json:"grant_all_ms"`
	RevokeAllMS float64 `json:"revoke_all_ms"`
}

type hub struct {
	name       string
	apiURL     string
	natsURL    string
	clusters   clusterv1connect.ClusterServiceClient
	projects   projectv1connect.ProjectServiceClient
	rbac       rbacv1connect.RBACServiceClient
	sets       placementv1connect.ClusterSetServiceClient
	placements placementv1connect.PlacementServiceClient
	endpoints  endpointv1connect.EndpointServiceClient
	// xdsAddr is the hub's xDS server (host:port), "" when it serves none.
	xdsAddr string
	token   string
	inst    *fleetd.Instance
	// child is the hub when it runs as a child process (-fleetd).
	child *childHub
	stop  func()
	// stopped receives why the embedded fleetd stopped (a service failed), if it did.
	stopped chan error
}

const embeddedToken = "fleetsim-admin-token"

func startHub(ctx context.Context, o options, log *zap.Logger) (*hub, error) {
	apiURL, natsURL, token := o.apiURL, o.natsURL, ""
	h := &hub{name: apiURL, stop: func() {}}
	if o.fleetd != "" {
		child, err := startChildHub(ctx, o.fleetd, embeddedToken, o.profile != "" || o.stormProfile != "")
		if err != nil {
			return nil, err
		}
		h.stop, h.stopped, h.child = child.stop, child.exited, child
		h.name = "fleetd as a child process (embedded NATS)"
		h.xdsAddr = child.xdsAddr
		apiURL, natsURL, token = child.apiURL, child.natsURL, embeddedToken
	} else if o.embedded {
		dir, err := os.MkdirTemp("", "fleetsim-")
		if err != nil {
			return nil, err
		}
		tokens := filepath.Join(dir, "tokens")
		if err := os.WriteFile(tokens, []byte(embeddedToken+",admin\n"), 0o600); err != nil {
			return nil, err
		}
		hctx, cancel := context.WithCancel(ctx)
		inst, err := fleetd.Start(hctx, fleetd.Config{
			DataDir:    filepath.Join(dir, "data"),
			Server:     server.Config{Listen: "127.0.0.1:0", TokenFile: tokens},
			NATSListen: "127.0.0.1:0",
			XDSListen:  "127.0.0.1:0",
			Authz:      authz.Config{PlatformAdmins: []string{"admin"}},
		}, log.Named("fleetd"))
		if err != nil {
			cancel()
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("start fleetd: %w", err)
		}
		h.stop = func() { cancel(); inst.Stop(); _ = os.RemoveAll(dir) }
		select {
		case <-inst.Ready():
		case <-time.After(60 * time.Second):
			h.stop()
			return nil, errors.New("embedded fleetd not ready within 60s")
		case <-ctx.Done():
			h.stop()
			return nil, ctx.Err()
		}
		h.inst, h.name, h.xdsAddr = inst, "embedded fleetd (embedded NATS)", inst.XDSAddr
		h.stopped = make(chan error, 1)
		go func() { h.stopped <- inst.Wait() }()
		apiURL, natsURL, token = "http://"+inst.Addr, inst.NATS.ClientURL(), embeddedToken
	} else {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("-token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	h.natsURL, h.apiURL = natsURL, apiURL
	// The token on every request, unary or streaming (WatchClusters).
	base := &http.Transport{MaxIdleConnsPerHost: 2 * apiWorkers}
	hc := &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+token)
		return base.RoundTrip(r)
	})}
	h.clusters = clusterv1connect.NewClusterServiceClient(hc, apiURL)
	h.projects = projectv1connect.NewProjectServiceClient(hc, apiURL)
	h.rbac = rbacv1connect.NewRBACServiceClient(hc, apiURL)
	h.sets = placementv1connect.NewClusterSetServiceClient(hc, apiURL)
	h.placements = placementv1connect.NewPlacementServiceClient(hc, apiURL)
	h.endpoints = endpointv1connect.NewEndpointServiceClient(hc, apiURL)
	h.token = token
	return h, nil
}

// simulate runs the scenarios of o. The result is returned also with an error, as far as it got.
func simulate(ctx context.Context, o options) (*Result, error) {
	log, err := logging.New(o.logLevel, false)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h, err := startHub(ctx, o, log)
	if err != nil {
		return nil, err
	}
	defer h.stop()
	// A hub that stops mid-run (one of fleetd's services failed) ends the run, with its reason:
	// otherwise every later call would only say "connection refused".
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var hubErr error
	endWatch, hubWatch := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(hubWatch)
		select {
		case err := <-h.stopped: // nil without -embedded: never
			hubErr = fmt.Errorf("the hub stopped during the run: %v", err)
			stopRun()
		case <-endWatch:
		}
	}()

	res := &Result{Started: time.Now().UTC().Format(time.RFC3339), Hub: h.name, Clusters: o.clusters, NamespacesPerCluster: o.namespaces,
		HeartbeatMS: ms(o.heartbeat), Ramp: o.ramp}
	// Names unique per run, so runs against one long-lived hub do not collide.
	run := randomID()
	clusters := make([]*simCluster, o.clusters)
	for i := range clusters {
		clusters[i] = newSimCluster(fmt.Sprintf("sim-%s-%d", run, i), o.namespaces)
	}
	var bad []*simCluster
	for _, kind := range misbehaviours() {
		for i := range o.misbehave[kind] {
			n := o.namespaces
			if kind == misInventory {
				n = bigInventory
			}
			c := newSimCluster(fmt.Sprintf("sim-%s-%s-%d", run, kind, i), n)
			c.misbehaviour = kind
			bad = append(bad, c)
		}
	}
	all := append(append([]*simCluster(nil), clusters...), bad...)
	agentsCtx, stopAgents := context.WithCancel(runCtx)
	defer func() {
		stopAgents()
		for _, c := range all {
			if c.nc != nil {
				<-c.done
			}
		}
	}()

	err = joinScenario(agentsCtx, o, h, all, clusters[0].name, log, res)
	if err == nil && o.has("grant") {
		err = grantScenario(agentsCtx, o, h, clusters, bad, "fleetsim-"+run, res)
	}
	if err == nil && o.has("storm") {
		err = stormScenario(agentsCtx, o, h, clusters, "fleetsim-"+run, res)
	}
	if err == nil && o.has("placement") {
		err = placementScenario(agentsCtx, o, h, clusters, run, res)
	}
	if err == nil && o.has("endpoints") {
		err = endpointsScenario(agentsCtx, o, h, clusters, run, res)
	}
	if err == nil && o.has("steady") {
		err = steadyScenario(agentsCtx, o, h, res)
	}
	close(endWatch)
	<-hubWatch
	if hubErr != nil {
		res.HubError = hubErr.Error()
		return res, hubErr
	}
	res.observe(ctx, h)
	if err == nil && len(res.Lost) > 0 {
		err = fmt.Errorf("%d lost (see \"lost\")", len(res.Lost))
	}
	return res, err
}

// joinScenario registers every cluster through the API at the ramp rate, starts its agent, and
// waits until the hub shows every one Connected.
func joinScenario(ctx context.Context, o options, h *hub, clusters []*simCluster, victim string, log *zap.Logger, res *Result) error {
	registered := make([]time.Time, len(clusters))
	regLatency := make([]time.Duration, len(clusters))
	index := make(map[string]int, len(clusters))
	for i, c := range clusters {
		index[c.name] = i
	}
	// Each cluster's Connected is seen on a watch opened before the first registration, as it
	// happens (polling ListClusters after every registration had returned timed the early
	// clusters from when the last one registered: half the ramp's length at p50).
	connectedAt := make([]time.Time, len(clusters))
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	allConnected := make(chan struct{})
	watchErr := make(chan error, 1)
	go func() {
		// The call returns with the stream's first message (its headers are sent with it), so
		// it is made here; clusters registered meanwhile come in its snapshot.
		stream, err := h.clusters.WatchClusters(watchCtx, connect.NewRequest(&clusterv1.WatchClustersRequest{LabelSelector: "fleetsim=true"}))
		if err != nil {
			watchErr <- err
			return
		}
		missing := len(clusters)
		for stream.Receive() {
			cl := stream.Msg().GetCluster()
			i, ok := index[cl.GetName()]
			if !ok || !connectedAt[i].IsZero() {
				continue
			}
			if cond := clusterimport.Condition(cl, clusterimport.ConditionAgentConnected); cond != nil && cond.Status == clusterv1.ConditionStatus_CONDITION_STATUS_TRUE {
				connectedAt[i] = time.Now()
				if missing--; missing == 0 {
					close(allConnected)
					return
				}
			}
		}
		watchErr <- stream.Err()
	}()
	start := time.Now()
	var retries atomic.Int64
	err := forEach(ctx, len(clusters), o.ramp, func(i int) error {
		c := clusters[i]
		t0, reg, err := registerCluster(ctx, h, c.name, o.timeout, &retries)
		if err != nil {
			return err
		}
		regLatency[i], registered[i] = time.Since(t0), time.Now()
		return c.start(ctx, h.natsURL, reg.AgentToken, o, victim, log.Named(c.name))
	})

	if err != nil {
		return err
	}
	select {
	case <-allConnected:
	case err := <-watchErr:
		return fmt.Errorf("watch clusters: %w", err)
	case <-time.After(o.timeout):
	case <-ctx.Done():
		return ctx.Err()
	}
	stopWatch()
	<-allConnectedOrStopped(allConnected, watchErr)
	j := &JoinResult{Register: newDist(regLatency), RegisterRetries: retries.Load()}
	var connected []time.Duration
	var last time.Time
	for i, at := range connectedAt {
		if at.IsZero() {
			res.Lost = append(res.Lost, "join: "+clusters[i].name+" never Connected")
			continue
		}
		connected = append(connected, at.Sub(registered[i]))
		if at.After(last) {
			last = at
		}
	}
	j.Connected = newDist(connected)
	var natsConnected []time.Duration
	for i, c := range clusters {
		if at := c.natsConnected.Load(); at != 0 {
			natsConnected = append(natsConnected, time.Unix(0, at).Sub(registered[i]))
		}
	}
	j.NATSConnected = newDist(natsConnected)
	if len(connected) == len(clusters) {
		j.AllConnectedMS = ms(last.Sub(start))
	}
	res.Join = j
	return nil
}

// registerCluster registers name and returns when its successful call started and what it
// answered. A call that timed out or found the hub unavailable is made again, as a client
// would (until timeout). The agent token is handed out only once, so when a call that timed out
// had in fact landed (the next answers AlreadyExists), the registration is deregistered and
// made again. Every retry is counted.
func registerCluster(ctx context.Context, h *hub, name string, timeout time.Duration, retries *atomic.Int64) (time.Time, *clusterv1.RegisterClusterResponse, error) {
	deadline := time.Now().Add(timeout)
	retried := false
	for {
		t0 := time.Now()
		reg, err := h.clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{
			Name: name, Labels: map[string]string{"fleetsim": "true"}}))
		if err == nil {
			return t0, reg.Msg, nil
		}
		code := connect.CodeOf(err)
		transient := code == connect.CodeDeadlineExceeded || code == connect.CodeUnavailable
		if !transient && !(retried && code == connect.CodeAlreadyExists) || time.Now().After(deadline) || ctx.Err() != nil {
			return t0, nil, fmt.Errorf("register %s: %w", name, err)
		}
		retries.Add(1)
		retried = true
		if code == connect.CodeAlreadyExists {
			// A deregistration accepted but not yet visible is done: the registration made
			// again answers AlreadyExists until the hub shows it, and comes back here.
			if err := retryTransient(ctx, time.Until(deadline), func() error {
				_, err := h.clusters.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: name}))
				return err
			}); err != nil && !notYetVisible(err) {
				return t0, nil, fmt.Errorf("register %s: deregister the registration whose answer was lost: %w", name, err)
			}
		}
		select {
		case <-ctx.Done():
			return t0, nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// grantScenario binds a project namespace on every cluster, then grants and revokes a project
// role binding o.rounds times, timing each cluster's agent applying (deleting) the RoleBinding.
// The misbehaving clusters (bad) get the namespace and every grant too, untimed, and are
// checked at the end.
func grantScenario(ctx context.Context, o options, h *hub, clusters, bad []*simCluster, project string, res *Result) error {
	if _, err := h.projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: project})); err != nil {
		return fmt.Errorf("create project %s: %w", project, err)
	}
	ns := project
	all := append(append([]*simCluster(nil), clusters...), bad...)
	for _, c := range all {
		c.watchNamespace.Store(&ns)
		c.resetTimes()
	}
	g := &GrantResult{}
	res.Grant = g
	start := time.Now()
	err := forEach(ctx, len(all), 0, func(i int) error {
		_, err := h.projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: project, Cluster: all[i].name, Namespace: ns}))
		if err != nil {
			return fmt.Errorf("bind namespace %s on %s: %w", ns, all[i].name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(bad) > 0 {
		// After the last round the grant is revoked: no RoleBinding anywhere.
		// Over three of a well-behaved agent's heartbeat intervals, a flooding one sends 30.
		defer checkMisbehaving(ctx, h, clusters[0].name, bad, project, ns, false, time.Minute, 3*o.heartbeat, res)
	}
	// A cluster lost in one phase is listed and left out of the next ones, so the rest of the
	// fleet is still measured (and what breaks first at a size is seen, not only that it broke).
	nsAt, lost, clusters := waitAll(ctx, clusters, o.timeout, func(c *simCluster) int64 { return c.nsApplied.Load() })
	for _, c := range lost {
		res.Lost = append(res.Lost, "bind: "+c+" never applied namespace "+ns)
	}
	if len(clusters) == 0 {
		return nil
	}
	g.BindAllAppliedMS = ms(maxTime(nsAt).Sub(start))

	subject := &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: simSubject}
	var grants, revokes []time.Duration
	for r := 0; r < o.rounds; r++ {
		for _, c := range clusters {
			c.resetTimes()
		}
		t0 := time.Now()
		_, err := h.rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{
			Project: project, Subject: subject, RoleTemplate: roles.ProjectMember}))
		if err := res.accepted(fmt.Sprintf("round %d: bind project role", r), err); err != nil {
			return err
		}
		var at []time.Time
		at, lost, clusters = waitAll(ctx, clusters, o.timeout, func(c *simCluster) int64 { return c.rbApplied.Load() })
		for _, c := range lost {
			res.Lost = append(res.Lost, fmt.Sprintf("grant round %d: %s never applied the RoleBinding", r, c))
		}
		if len(clusters) == 0 {
			return nil
		}
		round := GrantRound{GrantAllMS: ms(maxTime(at).Sub(t0))}
		for _, a := range at {
			grants = append(grants, a.Sub(t0))
		}
		for _, c := range clusters {
			if ok, err := c.holdsRoleBinding(ns); err != nil || !ok {
				res.Lost = append(res.Lost, fmt.Sprintf("grant round %d: %s does not hold the RoleBinding (%v)", r, c.name, err))
			}
		}

		for _, c := range clusters {
			c.resetTimes()
		}
		t0 = time.Now()
		_, err = h.rbac.UnbindProjectRole(ctx, connect.NewRequest(&rbacv1.UnbindProjectRoleRequest{
			Project: project, Subject: subject, RoleTemplate: roles.ProjectMember}))
		if err := res.accepted(fmt.Sprintf("round %d: unbind project role", r), err); err != nil {
			return err
		}
		at, lost, clusters = waitAll(ctx, clusters, o.timeout, func(c *simCluster) int64 { return c.rbDeleted.Load() })
		for _, c := range lost {
			res.Lost = append(res.Lost, fmt.Sprintf("revoke round %d: %s never removed the RoleBinding", r, c))
		}
		if len(clusters) == 0 {
			return nil
		}
		round.RevokeAllMS = ms(maxTime(at).Sub(t0))
		for _, a := range at {
			revokes = append(revokes, a.Sub(t0))
		}
		for _, c := range clusters {
			if ok, err := c.holdsRoleBinding(ns); err != nil || ok {
				res.Lost = append(res.Lost, fmt.Sprintf("revoke round %d: %s still holds a RoleBinding (%v)", r, c.name, err))
			}
		}
		g.Rounds = append(g.Rounds, round)
		g.Measured = len(clusters)
		g.Grant, g.Revoke = newDist(grants), newDist(revokes)
	}
	return nil
}

// accepted returns err unless it is nil or says the change was stored and only not yet visible
// to the API within the call's patience (pkg/apierr.NotYetVisible): the change stands, so the
// scenario goes on timing it, and the answer is kept in Warnings.
func (r *Result) accepted(call string, err error) error {
	if err == nil {
		return nil
	}
	if connect.CodeOf(err) == connect.CodeUnavailable && strings.Contains(err.Error(), "accepted but not yet visible") {
		r.Warnings = append(r.Warnings, call+": "+err.Error())
		return nil
	}
	return fmt.Errorf("%s: %w", call, err)
}

// waitAll waits until get is non-zero on every cluster, polling; it returns the times, the
// names of the clusters still at zero when timeout passed, and the other clusters.
func waitAll(ctx context.Context, clusters []*simCluster, timeout time.Duration, get func(*simCluster) int64) ([]time.Time, []string, []*simCluster) {
	deadline := time.Now().Add(timeout)
	for {
		done := 0
		for _, c := range clusters {
			if get(c) != 0 {
				done++
			}
		}
		if done == len(clusters) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	var at []time.Time
	var lost []string
	var done []*simCluster
	for _, c := range clusters {
		if v := get(c); v != 0 {
			at = append(at, time.Unix(0, v))
			done = append(done, c)
		} else {
			lost = append(lost, c.name)
		}
	}
	return at, lost, done
}

// forEach calls f for 0..n-1 from apiWorkers goroutines, started at most rate per second (0: no
// limit); the first error stops it.
func forEach(ctx context.Context, n int, rate float64, f func(i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for w := 0; w < apiWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
	var tick <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer t.Stop()
		tick = t.C
	}
feed:
	for i := 0; i < n; i++ {
		if tick != nil && i > 0 {
			select {
			case <-tick:
			case <-ctx.Done():
				break feed
			}
		}
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// observe records the hub's propagation histogram, its JetStream consumers (embedded only) and
// this process's memory.
func (r *Result) observe(ctx context.Context, h *hub) {
	r.Goroutines = runtime.NumGoroutine()
	r.RSSMB = rssMB()
	if prop, err := scrapePropagation(ctx, h.apiURL); err != nil {
		r.Warnings = append(r.Warnings, "propagation histogram not read: "+err.Error())
	} else {
		r.Propagation = prop
	}
	if h.inst == nil {
		return
	}
	streams := h.inst.JS.ListStreams(ctx)
	for info := range streams.Info() {
		r.Consumers += info.State.Consumers
		if info.State.Consumers > r.MaxConsumers {
			r.MaxConsumers, r.MaxConsumersStream = info.State.Consumers, info.Config.Name
		}
	}
}

// rssMB reads VmRSS from /proc (Linux); 0 elsewhere.
func rssMB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func maxTime(ts []time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if t.After(m) {
			m = t
		}
	}
	return m
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func randomID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// SteadyResult is the steady scenario: the fleet idle (agents heartbeating, nothing changing)
// for -idle.
type SteadyResult struct {
	IdleSeconds float64 `json:"idle_seconds"`
	// Scope says what HubCPU and HubRSSMB cover: the hub process alone (-fleetd), or this whole
	// process, hub and simulated agents together (-embedded).
	Scope         string  `json:"scope"`
	HubCPUPercent float64 `json:"hub_cpu_percent_of_a_core"`
	HubRSSMB      float64 `json:"hub_rss_mb"`
	// SimCPUPercent is this process's CPU (the simulated agents) when the hub is a child.
	SimCPUPercent float64 `json:"sim_cpu_percent_of_a_core,omitempty"`
}

// steadyScenario measures what an idle fleet costs: the CPU of the hub over -idle, as a
// percentage of one core, and its memory at the end.
func steadyScenario(ctx context.Context, o options, h *hub, res *Result) error {
	var hubPid, scope string
	switch {
	case h.child != nil:
		hubPid, scope = h.child.pid(), "hub process"
	case h.inst != nil:
		hubPid, scope = "self", "hub and simulator (one process)"
	default:
		return nil // a hub elsewhere: nothing of it to measure from here
	}
	hub0, err := readUsage(hubPid)
	if err != nil {
		return fmt.Errorf("steady: %w", err)
	}
	self0, _ := readUsage("self")
	start := time.Now()
	profiled := make(chan error, 1)
	if o.profile != "" {
		go func() { profiled <- h.child.cpuProfile(ctx, o.idle, o.profile) }()
	} else {
		profiled <- nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(o.idle):
	}
	wall := time.Since(start)
	hub1, err := readUsage(hubPid)
	if err != nil {
		return fmt.Errorf("steady: %w", err)
	}
	self1, _ := readUsage("self")
	st := &SteadyResult{IdleSeconds: wall.Seconds(), Scope: scope,
		HubCPUPercent: 100 * (hub1.cpu - hub0.cpu).Seconds() / wall.Seconds(), HubRSSMB: hub1.rssMB}
	if h.child != nil {
		st.SimCPUPercent = 100 * (self1.cpu - self0.cpu).Seconds() / wall.Seconds()
	}
	res.Steady = st
	return <-profiled
}

// allConnectedOrStopped is closed once the watch goroutine of joinScenario has ended, so
// connectedAt is no longer written.
func allConnectedOrStopped(all <-chan struct{}, errs <-chan error) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		select {
		case <-all:
		case <-errs:
		}
		close(done)
	}()
	return done
}

// StormResult is the storm scenario: the hub (fleetd and its embedded NATS) restarted under
// the whole fleet, every agent reconnecting at once; or, with -storm-cmd, a NATS node
// restarted under it, its agents reconnecting at once.
type StormResult struct {
	// Restarted says what: "hub" or the -storm-cmd.
	Restarted string `json:"restarted"`
	// HubDownMS is from the stop signal until the restarted hub was ready (with -storm-cmd:
	// until the command returned).
	HubDownMS float64 `json:"hub_down_ms"`
	// Disconnected counts the agents whose connection dropped: all with the hub restarted,
	// those on the restarted node otherwise.
	Disconnected int `json:"disconnected"`
	// Reconnected is, per disconnected cluster, from the stop signal until its agent's NATS
	// connection was re-established; AllReconnectedMS until the last.
	Reconnected      Dist    `json:"reconnected"`
	AllReconnectedMS float64 `json:"all_reconnected_ms"`
	// AllConnectedMS is from the stop signal until the hub showed every cluster Connected
	// (ListClusters, polled every 250 ms), the storm goal's figure.
	AllConnectedMS float64 `json:"all_connected_ms"`
	// GrantAfter is, per cluster, a grant made once all had reconnected → applied: the desired
	// state flows again (each agent replayed).
	GrantAfter Dist `json:"grant_after"`
	// NotConnected counts clusters the hub showed not Connected afterwards: none was lost.
	NotConnected int `json:"not_connected"`
	// HubCPUReconnectedS is the CPU time (seconds) the restarted hub process used from its
	// start until every agent had reconnected, HubCPUS until the grant made after the storm
	// was applied and revoked everywhere (with -fleetd; 0 otherwise).
	HubCPUReconnectedS float64 `json:"hub_cpu_reconnected_s,omitempty"`
	HubCPUS            float64 `json:"hub_cpu_s,omitempty"`
}

// stormProfileWindow is how long -storm-profile profiles the restarted hub.
const stormProfileWindow = 30 * time.Second

// hubCPUSeconds is the CPU time the child hub's current process has used, 0 without one.
func hubCPUSeconds(h *hub) float64 {
	if h.child == nil {
		return 0
	}
	u, err := readUsage(h.child.pid())
	if err != nil {
		return 0
	}
	return u.cpu.Seconds()
}

// stormScenario restarts the child hub on the same data and ports, and times the fleet's
// reconnection and the first grant after it; a cluster the hub then shows not Connected was
// marked lost though it was not, and is listed as lost.
func stormScenario(ctx context.Context, o options, h *hub, clusters []*simCluster, project string, res *Result) error {
	st := &StormResult{Restarted: "hub"}
	res.Storm = st
	for _, c := range clusters {
		c.reconnected.Store(0)
		c.disconnected.Store(0)
	}
	t0 := time.Now()
	if o.stormProfile != "" && h.child != nil {
		profiled := make(chan error, 1)
		go func() { profiled <- h.child.cpuProfileOfNext(ctx, h.child.pid(), stormProfileWindow, o.stormProfile) }()
		defer func() {
			if err := <-profiled; err != nil {
				fmt.Fprintln(os.Stderr, "fleetsim: storm profile:", err)
			}
		}()
	}
	if o.stormCmd != "" {
		st.Restarted = o.stormCmd
		if out, err := exec.CommandContext(ctx, "sh", "-c", o.stormCmd).CombinedOutput(); err != nil {
			return fmt.Errorf("storm: %s: %w: %s", o.stormCmd, err, bytes.TrimSpace(out))
		}
	} else if err := h.child.restart(ctx, o.timeout); err != nil {
		return fmt.Errorf("storm: restart the hub: %w", err)
	}
	ready := time.Now()
	st.HubDownMS = ms(ready.Sub(t0))
	// Only the agents whose connection dropped reconnect; with a NATS node restarted, the
	// others never noticed. They are still checked below to be shown Connected.
	all := clusters
	var dropped []*simCluster
	for _, c := range clusters {
		if c.disconnected.Load() != 0 || o.stormCmd == "" {
			dropped = append(dropped, c)
		}
	}
	st.Disconnected = len(dropped)
	at, lost, _ := waitAll(ctx, dropped, o.timeout, func(c *simCluster) int64 { return c.reconnected.Load() })
	for _, c := range lost {
		res.Lost = append(res.Lost, "storm: "+c+" never reconnected")
	}
	clusters = without(all, lost)
	if len(clusters) == 0 {
		return nil
	}
	// From the stop, not from ready: agents reconnect as soon as NATS is up, before the
	// services behind it are ready.
	var rec []time.Duration
	for _, a := range at {
		rec = append(rec, a.Sub(t0))
	}
	if len(rec) > 0 {
		st.Reconnected, st.AllReconnectedMS = newDist(rec), ms(maxTime(at).Sub(t0))
	}
	st.HubCPUReconnectedS = hubCPUSeconds(h)
	if err := waitAllConnected(ctx, h, clusters, o.timeout); err != nil {
		res.Lost = append(res.Lost, "storm: "+err.Error())
	} else {
		st.AllConnectedMS = ms(time.Since(t0))
	}

	subject := &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: simSubject}
	for _, c := range clusters {
		c.resetTimes()
	}
	tg := time.Now()
	// Right after the restart the hub may still be catching up under the replaying fleet: the
	// call is retried, as a client would, while it times out or is unavailable.
	err := retryTransient(ctx, o.timeout, func() error {
		_, err := h.rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{
			Project: project, Subject: subject, RoleTemplate: roles.ProjectMember}))
		return err
	})
	if err := res.accepted("storm: bind project role", err); err != nil {
		return err
	}
	at, lost, clusters = waitAll(ctx, clusters, o.timeout, func(c *simCluster) int64 { return c.rbApplied.Load() })
	for _, c := range lost {
		res.Lost = append(res.Lost, "storm: "+c+" never applied the grant made after it")
	}
	var grants []time.Duration
	for _, a := range at {
		grants = append(grants, a.Sub(tg))
	}
	st.GrantAfter = newDist(grants)
	// Back to what the grant scenario left: no RoleBinding (the misbehaving clusters are
	// checked against it).
	err = retryTransient(ctx, o.timeout, func() error {
		_, err := h.rbac.UnbindProjectRole(ctx, connect.NewRequest(&rbacv1.UnbindProjectRoleRequest{
			Project: project, Subject: subject, RoleTemplate: roles.ProjectMember}))
		return err
	})
	if err := res.accepted("storm: unbind project role", err); err != nil {
		return err
	}
	_, lost, _ = waitAll(ctx, clusters, o.timeout, func(c *simCluster) int64 { return c.rbDeleted.Load() })
	for _, c := range lost {
		res.Lost = append(res.Lost, "storm: "+c+" never removed the grant revoked after it")
	}
	st.HubCPUS = hubCPUSeconds(h)
	list, err := allClusters(ctx, h)
	if err != nil {
		return fmt.Errorf("storm: list clusters: %w", err)
	}
	names := map[string]bool{}
	for _, c := range clusters {
		names[c.name] = true
	}
	for _, cl := range list {
		if !names[cl.GetName()] {
			continue
		}
		if cond := clusterimport.Condition(cl, clusterimport.ConditionAgentConnected); cond == nil || cond.Status != clusterv1.ConditionStatus_CONDITION_STATUS_TRUE {
			st.NotConnected++
			res.Lost = append(res.Lost, "storm: "+cl.GetName()+" shown not Connected after the storm")
		}
	}
	return nil
}

// without returns clusters but those named in lost.
func without(clusters []*simCluster, lost []string) []*simCluster {
	if len(lost) == 0 {
		return clusters
	}
	gone := make(map[string]bool, len(lost))
	for _, n := range lost {
		gone[n] = true
	}
	var out []*simCluster
	for _, c := range clusters {
		if !gone[c.name] {
			out = append(out, c)
		}
	}
	return out
}

// waitAllConnected polls ListClusters until the hub shows every one of clusters Connected, or
// fails naming how many it does not once timeout passes.
func waitAllConnected(ctx context.Context, h *hub, clusters []*simCluster, timeout time.Duration) error {
	names := make(map[string]bool, len(clusters))
	for _, c := range clusters {
		names[c.name] = true
	}
	deadline := time.Now().Add(timeout)
	for {
		missing := len(names)
		list, err := allClusters(ctx, h)
		if err == nil {
			for _, cl := range list {
				if !names[cl.GetName()] {
					continue
				}
				if cond := clusterimport.Condition(cl, clusterimport.ConditionAgentConnected); cond != nil && cond.Status == clusterv1.ConditionStatus_CONDITION_STATUS_TRUE {
					missing--
				}
			}
			if missing == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d clusters not shown Connected %s after the restart (last error: %v)", missing, len(names), timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// notYetVisible reports whether err is the API's answer to a write it accepted and has not
// shown yet (apierr.NotYetVisible): the write stands.
func notYetVisible(err error) bool {
	return connect.CodeOf(err) == connect.CodeUnavailable && strings.Contains(err.Error(), "accepted but not yet visible")
}

// retryTransient calls f until it succeeds, fails otherwise than with a timeout,
// unavailability or a lost race (Aborted: "read again and retry"; a change accepted but not
// yet visible is returned, not retried), or timeout passes. A retried call that had taken
// effect answers AlreadyExists or NotFound: done.
func retryTransient(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		code := connect.CodeOf(err)
		switch {
		case err == nil:
			return nil
		case code == connect.CodeAlreadyExists || code == connect.CodeNotFound:
			return nil
		case strings.Contains(err.Error(), "accepted but not yet visible"):
			return err
		case code != connect.CodeDeadlineExceeded && code != connect.CodeUnavailable && code != connect.CodeAborted, time.Now().After(deadline):
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// allClusters lists every cluster, page after page: the hub pages ListClusters (500 a page
// unless asked) and a simulation runs thousands.
func allClusters(ctx context.Context, h *hub) ([]*clusterv1.Cluster, error) {
	var out []*clusterv1.Cluster
	req := &clusterv1.ListClustersRequest{PageSize: paging.MaxSize}
	err := paging.All(func(token string) (string, error) {
		req.PageToken = token
		res, err := h.clusters.ListClusters(ctx, connect.NewRequest(req))
		if err != nil {
			return "", err
		}
		out = append(out, res.Msg.Clusters...)
		return res.Msg.NextPageToken, nil
	})
	return out, err
}
