package audit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/audit"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1/auditv1connect"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

type trail struct {
	js     jetstream.JetStream
	svc    *audit.Service
	client auditv1connect.AuditServiceClient
	store  *events.Store
	stop   func()
}

// startTrail runs the audit service on real JetStream behind the API's authentication and
// authorization, with platform admin "admin", and the FLEET_NS stream to index.
func startTrail(t testing.TB, retention topology.Retentions) *trail {
	t.Helper()
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	if err := topology.Ensure(ctx, j.JS, 1, retention.Apply(topology.Topology{Streams: []jetstream.StreamConfig{
		topology.EventStream(subjects.NamespaceStream, "test", subjects.NamespacePrefix+".>"),
	}})); err != nil {
		t.Fatal(err)
	}
	tr := &trail{js: j.JS, store: events.NewStore(j.JS, "system:test")}
	tr.start(t, retention)
	return tr
}

// start runs a new service (a restart, after stop) and points the client at it.
func (tr *trail) start(t testing.TB, retention topology.Retentions) {
	t.Helper()
	svc, err := audit.New(testkit.Context(t, 30*time.Second), tr.js, audit.Config{Retention: retention}, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := testkit.TokenServer(t, tr.js, []string{"token-admin,admin"}, authz.Config{PlatformAdmins: []string{"admin"}}, testkit.Logger(t))
	tr.stop = testkit.RunComponents(t, srv, svc)
	hs := testkit.Serve(t, srv)
	tr.svc = svc
	tr.client = auditv1connect.NewAuditServiceClient(testkit.BearerClient(http.DefaultClient, "token-admin"), hs.URL)
}

// appendProjects appends n ProjectCreated events by actor, spread over projects p0..p9.
func (tr *trail) appendProjects(t testing.TB, actor string, n int) {
	t.Helper()
	ctx := identity.WithActor(testkit.Context(t, time.Minute), actor)
	for i := range n {
		p := fmt.Sprintf("p%d", i%10)
		if _, err := tr.store.Append(ctx, subjects.NamespacePrefix+".project."+keys.Encode(p), p, events.Expect{}, &projectv1.ProjectCreated{Name: p}); err != nil {
			t.Fatal(err)
		}
	}
}

func (tr *trail) list(t testing.TB, req *auditv1.ListActivityRequest) *auditv1.ListActivityResponse {
	t.Helper()
	res, err := tr.client.ListActivity(testkit.Context(t, 30*time.Second), connect.NewRequest(req))
	if err != nil {
		t.Fatalf("ListActivity(%v): %v", req, err)
	}
	return res.Msg
}

// waitRows waits until the filter matches n rows (read in pages).
func (tr *trail) waitRows(t testing.TB, req *auditv1.ListActivityRequest, n int) {
	t.Helper()
	testkit.Eventually(t, 30*time.Second, func() error {
		got := len(tr.all(t, req))
		if got != n {
			return fmt.Errorf("%d rows, want %d", got, n)
		}
		return nil
	})
}

func (tr *trail) all(t testing.TB, req *auditv1.ListActivityRequest) []*auditv1.Activity {
	t.Helper()
	var out []*auditv1.Activity
	q := proto.CloneOf(req)
	for {
		res := tr.list(t, q)
		out = append(out, res.Activities...)
		if res.NextPageToken == "" {
			return out
		}
		q.PageToken = res.NextPageToken
	}
}

// Paging over a few thousand events returns every row exactly once, no page is larger than
// asked, and a filter by project reads only that project's rows.
func TestPagingReturnsEveryRowOnce(t *testing.T) {
	tr := startTrail(t, nil)
	const n = 3000
	tr.appendProjects(t, "alice", n)
	tr.waitRows(t, &auditv1.ListActivityRequest{Actor: "alice", PageSize: 1000}, n)

	seen := map[uint64]int{}
	req := &auditv1.ListActivityRequest{PageSize: 70}
	pages := 0
	for {
		res := tr.list(t, req)
		pages++
		if len(res.Activities) > 70 {
			t.Fatalf("page of %d rows, asked for 70", len(res.Activities))
		}
		for _, a := range res.Activities {
			seen[a.Sequence]++
			if a.Actor != "alice" || a.Kind != "project" || a.Stream != subjects.NamespaceStream {
				t.Fatalf("row %v", a)
			}
		}
		if res.NextPageToken == "" {
			break
		}
		req.PageToken = res.NextPageToken
	}
	if len(seen) != n {
		t.Fatalf("%d distinct rows in %d pages, want %d", len(seen), pages, n)
	}
	for seq, c := range seen {
		if c != 1 {
			t.Fatalf("event %d listed %d times", seq, c)
		}
	}
	rows := tr.all(t, &auditv1.ListActivityRequest{Project: "p3", PageSize: 1000})
	if len(rows) != n/10 {
		t.Fatalf("project p3: %d rows, want %d", len(rows), n/10)
	}
	for _, a := range rows {
		if a.Project != "p3" || a.Name != "p3" {
			t.Fatalf("project p3 listed %v", a)
		}
	}
}

// A query whose time window excludes every row still ends each call after a bounded read,
// with a token to go on, rather than reading the whole store in one call.
func TestAllTimeQueryIsBoundedPerCall(t *testing.T) {
	tr := startTrail(t, nil)
	const n = 2000
	tr.appendProjects(t, "alice", n)
	tr.waitRows(t, &auditv1.ListActivityRequest{PageSize: 1000}, n)
	tr.svc.SetMaxScan(500)
	// Rows stored within the clock skew before since are read (a publisher's clock may be
	// ahead of the server's) and dropped by their time.
	req := &auditv1.ListActivityRequest{Since: timestamppb.New(time.Now().Add(time.Minute)), PageSize: 1000}
	calls := 0
	for {
		res := tr.list(t, req)
		calls++
		if len(res.Activities) != 0 {
			t.Fatalf("rows of the future: %v", res.Activities)
		}
		if res.NextPageToken == "" {
			break
		}
		req.PageToken = res.NextPageToken
	}
	if calls != n/500 {
		t.Fatalf("%d calls to read %d rows 500 at a time, want %d", calls, n, n/500)
	}
	// since/until bound the rows by their time.
	mid := time.Now()
	tr.appendProjects(t, "bob", 5)
	tr.waitRows(t, &auditv1.ListActivityRequest{Since: timestamppb.New(mid)}, 5)
}

func TestBadRequests(t *testing.T) {
	tr := startTrail(t, nil)
	tr.appendProjects(t, "alice", 3)
	tr.waitRows(t, &auditv1.ListActivityRequest{}, 3)
	first := tr.list(t, &auditv1.ListActivityRequest{PageSize: 1})
	for _, tc := range []struct {
		name string
		req  *auditv1.ListActivityRequest
		want string
	}{
		{"page too large", &auditv1.ListActivityRequest{PageSize: 1001}, "page_size"},
		{"negative page", &auditv1.ListActivityRequest{PageSize: -1}, "page_size"},
		{"until before since", &auditv1.ListActivityRequest{Since: timestamppb.New(time.Unix(100, 0)), Until: timestamppb.New(time.Unix(50, 0))}, "until"},
		{"garbage token", &auditv1.ListActivityRequest{PageToken: "!!"}, "page_token"},
		{"huge actor", &auditv1.ListActivityRequest{Actor: strings.Repeat("a", 513)}, "actor"},
		{"token of other filters", &auditv1.ListActivityRequest{PageSize: 1, Actor: "bob", PageToken: first.NextPageToken}, "other filters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tr.client.ListActivity(testkit.Context(t, 10*time.Second), connect.NewRequest(tc.req))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want invalid_argument naming %s", err, tc.want)
			}
		})
	}
}

// The trail follows FLEET_AUDIT's --stream-retention.
func TestRetentionFollowsStreamRetention(t *testing.T) {
	tr := startTrail(t, topology.Retentions{subjects.AuditStream: {MaxAge: 3 * time.Minute}})
	info, err := tr.js.Stream(testkit.Context(t, 10*time.Second), subjects.AuditStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().Config.MaxAge; got != 3*time.Minute {
		t.Fatalf("FLEET_AUDIT max age %s, want 3m", got)
	}
}

// A flood of one denied call by one user is two rows, the second counting the repeats; a flood
// of varied calls stores at most the user's burst (plus its rate over the flood's time) and the
// rest is counted as dropped.
func TestDenialFloodIsBounded(t *testing.T) {
	tr := startTrail(t, nil)
	limits := audit.DenialLimits{PerUser: rate.Every(time.Hour), PerUserBurst: 5, Process: 1000, ProcessBurst: 1000, Users: 100, Queue: 100,
		Coalesce: time.Hour, Pending: 100}
	rec := audit.NewDenialRecorder(tr.js, limits, testkit.Logger(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
	const flood, varied = 500, 50
	const deleteProject = "/fleetstream.project.v1.ProjectService/DeleteProject"
	for range flood {
		rec.RecordDenial("mallory", deleteProject, "projects", "team-a", "", "user \"mallory\" may not delete projects")
	}
	for i := range varied {
		rec.RecordDenial("mallory", deleteProject, "projects", fmt.Sprintf("p%d", i), "", "no")
	}
	rec.RecordDenial("bob", "/fleetstream.project.v1.ProjectService/CreateProject", "projects", "", "", "no")
	// The first of the flood, and the burst's other 4 of the varied calls.
	tr.waitRows(t, &auditv1.ListActivityRequest{DeniedOnly: true}, limits.PerUserBurst+1)
	rec.Flush(time.Now().Add(2 * time.Hour)) // the window ends
	tr.waitRows(t, &auditv1.ListActivityRequest{DeniedOnly: true}, limits.PerUserBurst+2)

	rows := tr.all(t, &auditv1.ListActivityRequest{Actor: "mallory", Project: "team-a"})
	if len(rows) != 2 || rows[0].Count != 1 || rows[1].Count != flood-1 {
		t.Fatalf("mallory's flood of %d identical calls is %v, want 2 rows counting 1 and %d", flood, rows, flood-1)
	}
	a := rows[1]
	if a.Type != "Denied" || a.Project != "team-a" || a.Procedure != deleteProject || !strings.Contains(a.Reason, "may not delete") {
		t.Fatalf("denial row %v", a)
	}
	if got := len(tr.all(t, &auditv1.ListActivityRequest{Actor: "mallory"})); got != limits.PerUserBurst+1 {
		t.Fatalf("%d rows of mallory, want %d", got, limits.PerUserBurst+1)
	}
	if got := testutil.ToFloat64(audit.Dropped(rec, audit.DropUserRate)); got != varied-float64(limits.PerUserBurst-1) {
		t.Fatalf("dropped %v, want %d", got, varied-(limits.PerUserBurst-1))
	}
}

// An indexer that stops and starts again, even from a checkpoint behind what it wrote (a crash
// between storing records and moving the checkpoint), lists every event once.
func TestRestartIndexesEveryEventOnce(t *testing.T) {
	tr := startTrail(t, nil)
	tr.appendProjects(t, "alice", 500)
	tr.waitRows(t, &auditv1.ListActivityRequest{PageSize: 1000}, 500)
	tr.stop()
	kv, err := tr.js.KeyValue(testkit.Context(t, 10*time.Second), subjects.AuditCheckpointsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(testkit.Context(t, 10*time.Second), subjects.NamespaceStream, []byte("100")); err != nil {
		t.Fatal(err)
	}
	tr.start(t, nil)
	tr.appendProjects(t, "bob", 100)
	tr.waitRows(t, &auditv1.ListActivityRequest{Actor: "bob", PageSize: 1000}, 100)
	rows := tr.all(t, &auditv1.ListActivityRequest{PageSize: 1000})
	seen := map[uint64]bool{}
	for _, a := range rows {
		if seen[a.Sequence] {
			t.Fatalf("event %d listed twice", a.Sequence)
		}
		seen[a.Sequence] = true
	}
	if len(seen) != 600 {
		t.Fatalf("%d events listed, want 600", len(seen))
	}
}

// A denial naming a project of any length is still recorded, as the platform's, with a bounded
// reason: the request's values never make a subject or a row NATS refuses.
func TestDenialOfAHugeNameIsBounded(t *testing.T) {
	tr := startTrail(t, nil)
	rec := audit.NewDenialRecorder(tr.js, audit.DefaultDenialLimits, testkit.Logger(t))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = rec.Run(ctx) }()
	huge := strings.Repeat("x", 100_000)
	rec.RecordDenial("mallory", "/fleetstream.project.v1.ProjectService/BindNamespace", "namespacebindings", huge, huge, "project "+huge)
	tr.waitRows(t, &auditv1.ListActivityRequest{Actor: "mallory"}, 1)
	a := tr.list(t, &auditv1.ListActivityRequest{Actor: "mallory"}).Activities[0]
	if a.Project != "" || a.Cluster != "" || len(a.Reason) > 1100 || !strings.HasPrefix(a.Reason, "project xxx") {
		t.Fatalf("row of project %d bytes, cluster %d bytes, reason %d bytes", len(a.Project), len(a.Cluster), len(a.Reason))
	}
}

// A row whose event's publisher clock is ahead of the NATS server's is stored before the time it
// carries: a query from since still lists it, and one until a time before it does not.
func TestSinceAllowsForClockSkew(t *testing.T) {
	tr := startTrail(t, nil)
	ahead := time.Now().Add(3 * time.Minute).Truncate(time.Millisecond)
	payload, err := anypb.New(&projectv1.ProjectCreated{Name: "skewed"})
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(&eventv1.Envelope{Id: "e1", Type: "fleetstream.project.v1.ProjectCreated", AggregateId: "skewed",
		Time: timestamppb.New(ahead), Actor: "carol", Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.js.Publish(testkit.Context(t, 10*time.Second), subjects.NamespacePrefix+".project.skewed", data); err != nil {
		t.Fatal(err)
	}
	tr.waitRows(t, &auditv1.ListActivityRequest{Actor: "carol"}, 1)
	for _, tc := range []struct {
		name string
		req  *auditv1.ListActivityRequest
		want int
	}{
		{"since a minute before its time", &auditv1.ListActivityRequest{Since: timestamppb.New(ahead.Add(-time.Minute))}, 1},
		{"since its time", &auditv1.ListActivityRequest{Since: timestamppb.New(ahead)}, 1},
		{"since after its time", &auditv1.ListActivityRequest{Since: timestamppb.New(ahead.Add(time.Millisecond))}, 0},
		{"until its time", &auditv1.ListActivityRequest{Until: timestamppb.New(ahead)}, 0},
		{"until after its time", &auditv1.ListActivityRequest{Until: timestamppb.New(ahead.Add(time.Millisecond))}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := len(tr.all(t, tc.req)); got != tc.want {
				t.Fatalf("%d rows, want %d", got, tc.want)
			}
		})
	}
}

// Denied rows, which anyone can cause, leave the trail after the recorder's TTL; event rows stay.
func TestDeniedRowsExpire(t *testing.T) {
	tr := startTrail(t, nil)
	limits := audit.DefaultDenialLimits
	limits.TTL = 2 * time.Second
	rec := audit.NewDenialRecorder(tr.js, limits, testkit.Logger(t))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = rec.Run(ctx) }()
	tr.appendProjects(t, "alice", 1)
	rec.RecordDenial("mallory", "/fleetstream.project.v1.ProjectService/DeleteProject", "projects", "p0", "", "no")
	tr.waitRows(t, &auditv1.ListActivityRequest{Project: "p0"}, 2)
	tr.waitRows(t, &auditv1.ListActivityRequest{DeniedOnly: true}, 0)
	if rows := tr.all(t, &auditv1.ListActivityRequest{Project: "p0"}); len(rows) != 1 || rows[0].Actor != "alice" {
		t.Fatalf("after the denial's TTL: %v, want alice's event", rows)
	}
}

// A service newer than the audit service records denials into a FLEET_AUDIT that does not
// allow TTLs yet: they are stored without one rather than lost.
func TestDenialIntoAStreamWithoutTTLs(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	i := slices.IndexFunc(audit.Topology().Streams, func(sc jetstream.StreamConfig) bool { return sc.Name == subjects.AuditStream })
	old := audit.Topology().Streams[i]
	old.AllowMsgTTL = false
	s, err := j.JS.CreateStream(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	rec := audit.NewDenialRecorder(j.JS, audit.DefaultDenialLimits, testkit.Logger(t))
	rctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() { _ = rec.Run(rctx) }()
	rec.RecordDenial("mallory", "/fleetstream.project.v1.ProjectService/DeleteProject", "projects", "p0", "", "no")
	testkit.Eventually(t, 10*time.Second, func() error {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 1 {
			return fmt.Errorf("%d rows stored, want 1 (dropped %v)", info.State.Msgs, testutil.ToFloat64(audit.Dropped(rec, audit.DropPublish)))
		}
		return nil
	})
}
