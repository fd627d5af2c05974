package audit

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// DenialLimits bound how many denied calls are recorded: repeats of one call coalesced into one
// row a window, a token bucket per user, one for the process, and a queue between the API and
// the store. What exceeds the buckets and the queue is counted in
// fleetstream_audit_denials_dropped_total and not stored, so a client hammering a refused call
// costs the store two rows a Coalesce window, and one varying its calls at most PerUserBurst
// records and then PerUser a second.
type DenialLimits struct {
	PerUser      rate.Limit
	PerUserBurst int
	Process      rate.Limit
	ProcessBurst int
	// Users bounds the per-user buckets kept; when full they are all forgotten (the process
	// bucket still bounds the total).
	Users int
	Queue int
	// Coalesce is the window within which repeats of a denied call (same user, procedure,
	// resource, project, cluster and reason) are one row: the first is recorded at once, the
	// repeats as one row with their count when the window ends. 0 records every call.
	Coalesce time.Duration
	// Pending bounds the calls being coalesced at once; a call beyond them is recorded alone.
	Pending int
	// TTL is how long a denied row is kept (a per-message TTL: FLEET_AUDIT keeps event rows by
	// its own limits, forever by default, and denied rows no longer than this), so that refused
	// calls, which anyone can make, cannot grow the store without bound. 0 keeps them as long
	// as event rows.
	TTL time.Duration
}

// jsMessageTTLDisabled is JetStream's error code for a TTL on a stream that does not allow them.
const jsMessageTTLDisabled = 10166

// DefaultDenialLimits: a user is recorded for 20 denials at once and then one a second; a
// process for 200 at once and then 50 a second.
var DefaultDenialLimits = DenialLimits{PerUser: 1, PerUserBurst: 20, Process: 50, ProcessBurst: 200, Users: 10_000, Queue: 1024,
	Coalesce: time.Minute, Pending: 10_000, TTL: 90 * 24 * time.Hour}

// Bounds of a denial record's fields that come from the request.
const (
	maxNameBytes   = 253
	maxReasonBytes = 1024
)

// Reasons a denial record is dropped (label reason).
const (
	DropUserRate    = "user_rate"
	DropProcessRate = "process_rate"
	DropQueueFull   = "queue_full"
	DropPublish     = "publish_failed"
)

// DenialRecorder records denied API calls as activity (authz.DenialRecorder): rate limited,
// queued without blocking the call, and published to FLEET_AUDIT by Run.
type DenialRecorder struct {
	js     jetstream.JetStream
	log    *zap.Logger
	limits DenialLimits
	now    func() time.Time

	mu      sync.Mutex
	users   map[string]*rate.Limiter
	process *rate.Limiter
	queue   chan *auditv1.Activity
	// pending are the calls being coalesced, by denialKey.
	pending map[denialKey]*pendingDenial

	recorded prometheus.Counter
	dropped  *prometheus.CounterVec
	// lastWarn is when a failed publish was last logged (Run's goroutine only): at most one a
	// minute, since a hub without the audit service (no FLEET_AUDIT) fails every one.
	lastWarn time.Time
}

// NewDenialRecorder returns a recorder publishing through js; register its Collectors and run
// Run.
func NewDenialRecorder(js jetstream.JetStream, limits DenialLimits, log *zap.Logger) *DenialRecorder {
	r := &DenialRecorder{js: js, log: log.Named("audit-denials"), limits: limits, now: time.Now,
		users:   make(map[string]*rate.Limiter),
		pending: make(map[denialKey]*pendingDenial),
		process: rate.NewLimiter(limits.Process, limits.ProcessBurst),
		queue:   make(chan *auditv1.Activity, max(limits.Queue, 1)),
		recorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetstream_audit_denials_recorded_total",
			Help: "Denied API calls recorded as audit activity (stream FLEET_AUDIT).",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetstream_audit_denials_dropped_total",
			Help: "Denied API calls not recorded as audit activity, by reason: user_rate and process_rate (a rate limit), queue_full, publish_failed.",
		}, []string{"reason"}),
	}
	for _, reason := range []string{DropUserRate, DropProcessRate, DropQueueFull, DropPublish} {
		r.dropped.WithLabelValues(reason)
	}
	return r
}

// Collectors are the recorder's metrics.
func (r *DenialRecorder) Collectors() []prometheus.Collector {
	return []prometheus.Collector{r.recorded, r.dropped}
}

// denialKey is what makes denied calls the same call.
type denialKey struct{ user, procedure, resource, project, cluster, reason string }

// pendingDenial is a call recorded at start whose repeats within the window are counted.
type pendingDenial struct {
	row     *auditv1.Activity
	start   time.Time
	repeats uint32
	last    time.Time
}

// RecordDenial queues one denied call; it never blocks.
func (r *DenialRecorder) RecordDenial(user, procedure, resource, project, cluster, reason string) {
	now := r.now()
	// The project and cluster are the caller's request, so of any length: no real one is longer
	// than a Kubernetes name, and a longer one would make a subject NATS refuses. Such a row is
	// the platform's, with the request's value still in the (bounded) reason.
	if len(project) > maxNameBytes {
		project = ""
	}
	if len(cluster) > maxNameBytes {
		cluster = ""
	}
	if len(reason) > maxReasonBytes {
		reason = strings.ToValidUTF8(reason[:maxReasonBytes], "") + "…"
	}
	key := denialKey{user, procedure, resource, project, cluster, reason}
	r.mu.Lock()
	if p, ok := r.pending[key]; ok && now.Sub(p.start) < r.limits.Coalesce {
		p.repeats++
		p.last = now
		r.mu.Unlock()
		return
	}
	l, ok := r.users[user]
	if !ok {
		if len(r.users) >= max(r.limits.Users, 1) {
			clear(r.users)
		}
		l = rate.NewLimiter(r.limits.PerUser, r.limits.PerUserBurst)
		r.users[user] = l
	}
	userOK := l.AllowN(now, 1)
	processOK := userOK && r.process.AllowN(now, 1)
	a := &auditv1.Activity{Time: timestamppb.New(now), Actor: user, Type: "Denied", Kind: resource,
		Project: project, Cluster: cluster, Procedure: procedure, Reason: reason, Count: 1}
	var flush *auditv1.Activity
	if userOK && processOK && r.limits.Coalesce > 0 {
		// A window that ended without Flush having run yet: its repeats first.
		if p, ok := r.pending[key]; ok {
			flush = p.flushRow()
			delete(r.pending, key)
		}
		if len(r.pending) < max(r.limits.Pending, 1) {
			r.pending[key] = &pendingDenial{row: a, start: now}
		}
	}
	r.mu.Unlock()
	switch {
	case !userOK:
		r.dropped.WithLabelValues(DropUserRate).Inc()
		return
	case !processOK:
		r.dropped.WithLabelValues(DropProcessRate).Inc()
		return
	}
	if flush != nil {
		r.enqueue(flush)
	}
	r.enqueue(a)
}

// flushRow is the row of p's repeats, nil if there were none.
func (p *pendingDenial) flushRow() *auditv1.Activity {
	if p.repeats == 0 {
		return nil
	}
	row := proto.CloneOf(p.row)
	row.Time, row.Count = timestamppb.New(p.last), p.repeats
	return row
}

func (r *DenialRecorder) enqueue(a *auditv1.Activity) {
	select {
	case r.queue <- a:
	default:
		r.dropped.WithLabelValues(DropQueueFull).Inc()
	}
}

// Flush queues the rows of the repeats whose window ended by now. Run calls it every window;
// the rows of repeats bypass the rate limits, being at most one per row the limits admitted.
func (r *DenialRecorder) Flush(now time.Time) {
	var rows []*auditv1.Activity
	r.mu.Lock()
	for k, p := range r.pending {
		if now.Sub(p.start) < r.limits.Coalesce {
			continue
		}
		if row := p.flushRow(); row != nil {
			rows = append(rows, row)
		}
		delete(r.pending, k)
	}
	r.mu.Unlock()
	for _, row := range rows {
		r.enqueue(row)
	}
}

// Run publishes queued records, and the repeats of each window, until ctx ends.
func (r *DenialRecorder) Run(ctx context.Context) error {
	var tick <-chan time.Time
	if r.limits.Coalesce > 0 {
		// Half the window: a window's repeats are recorded at most 1.5 windows after its start.
		t := time.NewTicker(max(r.limits.Coalesce/2, time.Second))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			// The repeats counted so far are recorded on a clean stop, for a few seconds at most.
			r.Flush(r.now().Add(r.limits.Coalesce))
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			for dctx.Err() == nil {
				select {
				case a := <-r.queue:
					r.publish(dctx, a)
				default:
					return nil
				}
			}
			return nil
		case <-tick:
			r.Flush(r.now())
		case a := <-r.queue:
			r.publish(ctx, a)
		}
	}
}

func (r *DenialRecorder) publish(ctx context.Context, a *auditv1.Activity) {
	data, err := proto.Marshal(a)
	if err != nil {
		r.dropped.WithLabelValues(DropPublish).Inc()
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	msg := &nats.Msg{Subject: activitySubject(ClassDenied, a), Data: data}
	opts := []jetstream.PublishOpt{jetstream.WithExpectStream(subjects.AuditStream)}
	_, err = r.js.PublishMsg(pctx, msg, append(opts, jetstream.WithMsgTTL(r.limits.TTL))...)
	if apiErr := (*jetstream.APIError)(nil); r.limits.TTL > 0 && errors.As(err, &apiErr) && apiErr.ErrorCode == jsMessageTTLDisabled {
		// A FLEET_AUDIT of an audit service older than this process: kept like event rows.
		_, err = r.js.PublishMsg(pctx, &nats.Msg{Subject: msg.Subject, Data: data}, opts...)
	}
	if err != nil {
		if now := r.now(); ctx.Err() == nil && now.Sub(r.lastWarn) >= time.Minute {
			r.lastWarn = now
			r.log.Warn("could not record a denied call as audit activity (is the audit service, fleetd or rbac-sync, running?); "+
				"fleetstream_audit_denials_dropped_total counts the others", zap.String("procedure", a.Procedure), zap.Error(err))
		}
		r.dropped.WithLabelValues(DropPublish).Inc()
		return
	}
	r.recorded.Inc()
}
