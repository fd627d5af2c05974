package audit

import (
	"context"
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

// DenialLimits bound how many denied calls are recorded: a token bucket per user, one for the
// process, and a queue between the API and the store. What exceeds them is counted in
// fleetstream_audit_denials_dropped_total and not stored, so a client hammering a refused
// call costs the store at most PerUserBurst records and then PerUser a second.
type DenialLimits struct {
	PerUser      rate.Limit
	PerUserBurst int
	Process      rate.Limit
	ProcessBurst int
	// Users bounds the per-user buckets kept; when full they are all forgotten (the process
	// bucket still bounds the total).
	Users int
	Queue int
}

// DefaultDenialLimits: a user is recorded for 20 denials at once and then one a second; a
// process for 200 at once and then 50 a second.
var DefaultDenialLimits = DenialLimits{PerUser: 1, PerUserBurst: 20, Process: 50, ProcessBurst: 200, Users: 10_000, Queue: 1024}

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

// RecordDenial queues one denied call; it never blocks.
func (r *DenialRecorder) RecordDenial(user, procedure, resource, project, cluster, reason string) {
	now := r.now()
	r.mu.Lock()
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
	r.mu.Unlock()
	switch {
	case !userOK:
		r.dropped.WithLabelValues(DropUserRate).Inc()
		return
	case !processOK:
		r.dropped.WithLabelValues(DropProcessRate).Inc()
		return
	}
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
	a := &auditv1.Activity{Time: timestamppb.New(now), Actor: user, Type: "Denied", Kind: resource,
		Project: project, Cluster: cluster, Procedure: procedure, Reason: reason}
	select {
	case r.queue <- a:
	default:
		r.dropped.WithLabelValues(DropQueueFull).Inc()
	}
}

// Run publishes queued records until ctx ends.
func (r *DenialRecorder) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
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
	if _, err := r.js.PublishMsg(pctx, msg, jetstream.WithExpectStream(subjects.AuditStream)); err != nil {
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
