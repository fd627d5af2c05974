package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// minP99Samples is the fewest samples a p99 is reported from; below it the p99 would be the
// maximum under another name, so the maximum is reported as such.
const minP99Samples = 200

// Dist summarises latencies in milliseconds. P99 is set only with at least minP99Samples
// samples; otherwise only Max says what the tail is ("max of N").
type Dist struct {
	N   int      `json:"n"`
	P50 float64  `json:"p50_ms"`
	P99 *float64 `json:"p99_ms,omitempty"`
	Max float64  `json:"max_ms"`
}

func newDist(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	d := Dist{N: len(s), P50: ms(quantile(s, 0.50)), Max: ms(s[len(s)-1])}
	if len(s) >= minP99Samples {
		p := ms(quantile(s, 0.99))
		d.P99 = &p
	}
	return d
}

// quantile is the nearest-rank quantile of sorted s.
func quantile(s []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// tail says the p99, or the maximum and how few samples it is of.
func (d Dist) tail() string {
	if d.N == 0 {
		return "-"
	}
	if d.P99 != nil {
		return fmt.Sprintf("p99 %.1f ms", *d.P99)
	}
	return fmt.Sprintf("max of %d: %.1f ms", d.N, d.Max)
}

func writeTable(w io.Writer, r *Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "fleetsim: %d clusters, %d namespaces each, heartbeat %s, ramp %g/s, hub: %s\n",
		r.Clusters, r.NamespacesPerCluster, time.Duration(r.HeartbeatMS*float64(time.Millisecond)), r.Ramp, r.Hub)
	fmt.Fprintln(tw, "figure\tp50\ttail\tall")
	if j := r.Join; j != nil {
		fmt.Fprintf(tw, "registration call\t%.1f ms\t%s\t%d retried after a timeout\n", j.Register.P50, j.Register.tail(), j.RegisterRetries)
		fmt.Fprintf(tw, "registered → agent's NATS connection accepted\t%.0f ms\t%s\t\n", j.NATSConnected.P50, j.NATSConnected.tail())
		fmt.Fprintf(tw, "registered → Connected (per cluster)\t%.0f ms\t%s\t%.0f ms until all Connected\n", j.Connected.P50, j.Connected.tail(), j.AllConnectedMS)
	}
	if g := r.Grant; g != nil {
		fmt.Fprintf(tw, "namespace bound → applied everywhere\t\t\t%.0f ms\n", g.BindAllAppliedMS)
		fmt.Fprintf(tw, "grant → RoleBinding applied (%d rounds, %d clusters)\t%.1f ms\t%s\t\n", len(g.Rounds), g.Measured, g.Grant.P50, g.Grant.tail())
		fmt.Fprintf(tw, "revoke → RoleBinding removed\t%.1f ms\t%s\t\n", g.Revoke.P50, g.Revoke.tail())
	}
	if st := r.Storm; st != nil {
		fmt.Fprintf(tw, "storm: %s, down\t\t\t%.0f ms\n", st.Restarted, st.HubDownMS)
		fmt.Fprintf(tw, "storm: stopped → agent reconnected (%d disconnected)\t%.0f ms\t%s\t%.0f ms until all reconnected\n", st.Disconnected, st.Reconnected.P50, st.Reconnected.tail(), st.AllReconnectedMS)
		fmt.Fprintf(tw, "storm: stopped → hub shows every cluster Connected\t\t\t%.0f ms\n", st.AllConnectedMS)
		fmt.Fprintf(tw, "storm: grant after it → applied\t%.1f ms\t%s\t%d shown not Connected\n", st.GrantAfter.P50, st.GrantAfter.tail(), st.NotConnected)
		if st.HubCPUS > 0 {
			fmt.Fprintf(tw, "storm: restarted hub's CPU\t\t\t%.1f s until all reconnected, %.1f s until the grant after it was applied and revoked\n", st.HubCPUReconnectedS, st.HubCPUS)
		}
	}
	if p := r.Placement; p != nil {
		fmt.Fprintf(tw, "placement: namespace bound → applied on every decided cluster\t\t\t%.0f ms\n", p.BindAllAppliedMS)
		fmt.Fprintf(tw, "placement: label change → namespace applied (%d rounds, %d clusters)\t%.1f ms\t%s\t\n", len(p.Rounds), p.Measured, p.Selected.P50, p.Selected.tail())
		fmt.Fprintf(tw, "placement: label change → namespace removed\t%.1f ms\t%s\t\n", p.Deselected.P50, p.Deselected.tail())
	}
	if e := r.Endpoints; e != nil {
		fmt.Fprintf(tw, "endpoints: %d services per cluster reported → all served\t\t\t%.0f ms\n", e.Services, e.LoadAllServedMS)
		fmt.Fprintf(tw, "endpoints: slice updated → served by GetServiceEndpoints (%d rounds)\t%.1f ms\t%s\t\n", len(e.Rounds), e.Served.P50, e.Served.tail())
		if e.XDS.N > 0 {
			fmt.Fprintf(tw, "endpoints: slice updated → received by an xDS client\t%.1f ms\t%s\t\n", e.XDS.P50, e.XDS.tail())
		}
	}
	if st := r.Steady; st != nil {
		sim := ""
		if st.SimCPUPercent > 0 {
			sim = fmt.Sprintf("; simulator %.1f%%", st.SimCPUPercent)
		}
		fmt.Fprintf(tw, "idle fleet for %.0f s (%s)\t\t\tCPU %.1f%% of a core, RSS %.0f MB%s\n", st.IdleSeconds, st.Scope, st.HubCPUPercent, st.HubRSSMB, sim)
	}
	for _, p := range r.Propagation {
		fmt.Fprintf(tw, "hub's propagation histogram, %s (%d changes)	%.2f s	p99 %.2f s	%.1f%% within 2 s\n", p.Kind, p.Count, p.P50, p.P99, 100*p.WithinGoal)
	}
	for _, m := range r.Misbehaving {
		refused := ""
		if m.Kind == misForeign {
			refused = fmt.Sprintf(", %d attempts refused by NATS", m.Refused)
		}
		if m.Kind == misFlood {
			refused = fmt.Sprintf(", %.1fx a well-behaved cluster's heartbeats on /metrics", m.HeartbeatRatio)
		}
		if m.Kind == misInventory {
			refused = fmt.Sprintf(", hub shows %d namespaces (out of limits: %t)", m.NamespaceCount, m.OutOfLimits)
		}
		if m.Kind == misNoAck {
			refused = ", hub shows its binding " + m.BindingPhase
		}
		fmt.Fprintf(tw, "misbehaving: %s\t\t\t%d of %d converged%s\n", m.Kind, m.Converged, m.Clusters, refused)
	}
	if r.Consumers > 0 {
		fmt.Fprintf(tw, "JetStream consumers\t\t\t%d (most on one stream: %d, %s)\n", r.Consumers, r.MaxConsumers, r.MaxConsumersStream)
	}
	who := "simulator"
	if strings.HasPrefix(r.Hub, "embedded") {
		who = "hub + simulator"
	}
	fmt.Fprintf(tw, "process RSS (%s)\t\t\t%.0f MB, %d goroutines\n", who, r.RSSMB, r.Goroutines)
	_ = tw.Flush()
	for _, l := range r.Lost {
		fmt.Fprintf(w, "LOST: %s\n", l)
	}
	for _, l := range r.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", l)
	}
}
