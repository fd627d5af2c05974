// Command fleetsim is the fleet simulator: one process, many simulated member clusters, each
// registered through the hub's API, with its own agent token and its own NATS connection under
// the agent's real permissions, running the agent's real hub-facing code (heartbeats with
// resources, namespace inventory, the desired-state watches and applier with their `applied`
// statuses) against in-memory Kubernetes clients (client-go's fakes). The hub cannot tell a
// simulated agent from a real one.
//
// It runs scenarios and prints what it measured as one JSON object on stdout and a table on
// stderr:
//
//	fleetsim -clusters 100 -scenario join,grant -rounds 20
//
// With -embedded (the default) it starts fleetd in process (embedded NATS, a temporary data
// directory); otherwise it drives a running hub: -api-url, -nats-url and -token-file (a platform
// admin's API token).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fleetstream/fleetstream/pkg/liveness"
)

type options struct {
	clusters   int
	namespaces int
	heartbeat  time.Duration
	ramp       float64
	scenarios  []string
	rounds     int
	timeout    time.Duration
	embedded   bool
	apiURL     string
	natsURL    string
	tokenFile  string
	logLevel   string
	fleetd     string
	stormCmd   string
	// stormProfile, with -fleetd, is where the storm scenario saves a CPU profile of the
	// restarted hub ("" for none).
	stormProfile string
	idle         time.Duration
	profile      string
	misbehave    map[string]int
	services     int
	results      string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(1)
	}
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	var o options
	var scenarios, misbehave string
	fs := flag.NewFlagSet("fleetsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.clusters, "clusters", 10, "simulated member clusters")
	fs.IntVar(&o.namespaces, "namespaces", 5, "namespaces each simulated cluster holds (besides default and kube-system)")
	fs.DurationVar(&o.heartbeat, "heartbeat", liveness.HeartbeatInterval, "heartbeat interval of every simulated agent (the agent's default)")
	fs.Float64Var(&o.ramp, "ramp", 100, "clusters registered and connected per second; 0 for as fast as the hub answers")
	fs.StringVar(&scenarios, "scenario", "join,grant", "scenarios to run, comma separated: join, grant, storm, placement, endpoints, steady (all but join need join; storm needs grant, and -fleetd or -storm-cmd)")
	fs.IntVar(&o.services, "services", 5, "endpoints scenario: services (one EndpointSlice each) every cluster reports")
	fs.StringVar(&o.results, "results", "", "append one JSON line of this run's figures to this file (what tools/fleetsim/plot reads)")
	fs.IntVar(&o.rounds, "rounds", 3, "grant scenario: rounds of grant then revoke")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "how long one phase (all Connected, all applied) may take before what is missing is reported lost")
	fs.BoolVar(&o.embedded, "embedded", true, "start fleetd in this process (embedded NATS, temporary data directory)")
	fs.StringVar(&o.apiURL, "api-url", "", "without -embedded: the hub's API, e.g. http://127.0.0.1:8080")
	fs.StringVar(&o.natsURL, "nats-url", "", "without -embedded: the NATS URL agents connect to")
	fs.StringVar(&o.tokenFile, "token-file", "", "without -embedded: file holding a platform admin's API token")
	fs.StringVar(&o.logLevel, "log-level", "error", "log level of the hub and the simulated agents: debug, info, warn or error")
	fs.StringVar(&o.fleetd, "fleetd", "", "run this fleetd binary as a child process (instead of in process), so the hub's CPU and memory are measured apart from the simulator")
	fs.DurationVar(&o.idle, "idle", 30*time.Second, "steady scenario: how long the idle fleet is measured")
	fs.StringVar(&misbehave, "misbehave", "", "extra misbehaving clusters, kind=N comma separated: reconnect (every second), flood (heartbeats 10x as often), inventory (30,000 namespaces), foreign (publishes and subscribes on another cluster's subjects), noack (never writes an applied status); not timed, checked to converge and to show on the hub")
	fs.StringVar(&o.stormCmd, "storm-cmd", "", "storm scenario without -fleetd: a shell command that restarts a NATS node (or the hub) under the fleet and returns once it is started again, e.g. 'docker restart fleetstream-nats-1-1'")
	fs.StringVar(&o.stormProfile, "storm-profile", "", "with -fleetd and the storm scenario: save a CPU profile of the restarted hub over its first 30 s (from when it serves profiles) to this file")
	fs.StringVar(&o.profile, "hub-profile", "", "with -fleetd: save a CPU profile of the hub over the steady scenario's idle window to this file")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.misbehave, err = parseMisbehave(misbehave); err != nil {
		return o, err
	}
	for _, s := range strings.Split(scenarios, ",") {
		switch s = strings.TrimSpace(s); s {
		case "join", "grant", "storm", "placement", "endpoints", "steady":
			o.scenarios = append(o.scenarios, s)
		default:
			return o, fmt.Errorf("-scenario: unknown scenario %q (join, grant, storm, placement, endpoints, steady)", s)
		}
	}
	switch {
	case o.clusters < 1:
		return o, errors.New("-clusters: at least 1")
	case o.namespaces < 0:
		return o, errors.New("-namespaces: not negative")
	case o.heartbeat <= 0:
		return o, errors.New("-heartbeat: must be positive")
	case o.ramp < 0:
		return o, errors.New("-ramp: not negative")
	case o.idle <= 0:
		return o, errors.New("-idle: must be positive")
	case o.profile != "" && (o.fleetd == "" || !o.has("steady")):
		return o, errors.New("-hub-profile needs -fleetd and the steady scenario")
	case o.stormProfile != "" && (o.fleetd == "" || !o.has("storm")):
		return o, errors.New("-storm-profile needs -fleetd and the storm scenario")
	case o.services < 1 || o.services > 60_000:
		return o, errors.New("-services: 1 to 60,000")
	case o.rounds < 1:
		return o, errors.New("-rounds: at least 1")
	case !o.embedded && (o.apiURL == "" || o.natsURL == "" || o.tokenFile == ""):
		return o, errors.New("-embedded=false needs -api-url, -nats-url and -token-file")
	}
	if o.has("storm") && (!o.has("grant") || (o.fleetd == "") == (o.stormCmd == "")) {
		return o, errors.New("-scenario: storm needs grant (it grants again after the storm) and one of -fleetd (it restarts the hub) or -storm-cmd (the command that restarts a NATS node)")
	}
	if (o.has("grant") || o.has("steady")) && !o.has("join") {
		return o, errors.New("-scenario: grant and steady need join (the clusters they run on)")
	}
	if (o.has("placement") || o.has("endpoints")) && !o.has("join") {
		return o, errors.New("-scenario: placement and endpoints need join (the clusters they run on)")
	}
	return o, nil
}

func (o options) has(scenario string) bool {
	for _, s := range o.scenarios {
		if s == scenario {
			return true
		}
	}
	return false
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseOptions(args, stderr)
	if err != nil {
		return err
	}
	if err := raiseFileLimit(o.clusters); err != nil {
		// Not fatal: a run within the limit works, one past it fails with EMFILE where it runs out.
		fmt.Fprintln(stderr, "fleetsim: warning:", err)
	}
	res, err := simulate(ctx, o)
	if res != nil {
		writeTable(stderr, res)
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(res); jerr != nil && err == nil {
			err = jerr
		}
		if o.results != "" {
			if rerr := appendResult(o.results, res); rerr != nil && err == nil {
				err = rerr
			}
		}
	}
	return err
}

// appendResult appends res as one JSON line to path: runs at several sizes collect in one file
// for tools/fleetsim/plot.
func appendResult(path string, res *Result) error {
	line, err := json.Marshal(res)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("-results: %w", err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		_ = f.Close()
		return fmt.Errorf("-results: %w", err)
	}
	return f.Close()
}
