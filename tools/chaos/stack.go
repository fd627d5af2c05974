// Package chaos drives faults into the compose stack (make chaos): it kills NATS nodes and
// service replicas, partitions a member cluster's agent and restarts the whole stack, while a
// steady load of API writes runs through the gateway, and checks afterwards that every
// acknowledged write is there and every view equals a rebuild from its stream.
//
// It talks to the stack only through the ports docker-compose.yml publishes on 127.0.0.1 and
// to Docker through its CLI.
package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Stack is the running compose stack.
type Stack struct {
	// Root is the repository root (docker-compose.yml and .data/compose live there).
	Root string
	// Compose is the compose command with its -f files, e.g.
	// ["docker-compose", "-f", "docker-compose.yml", "-f", "deploy/chaos/docker-compose.yml"].
	Compose []string
	// Gateway is the API front door, http://127.0.0.1:18080.
	Gateway string
	// NATSURL is the NATS client port published for the host (nats-1).
	NATSURL string
	// NATSURLs are every node's client port published for the host (the chaos profile publishes
	// nats-2's and nats-3's too), for connections that must outlive a killed nats-1.
	NATSURLs string
	// Monitor maps a NATS node's service name to its published monitoring URL.
	Monitor map[string]string
}

// DefaultStack is the stack docker-compose.yml publishes, with the chaos profile on top.
func DefaultStack(root string) *Stack {
	return &Stack{
		Root:     root,
		Compose:  []string{"docker-compose", "-f", "docker-compose.yml", "-f", "deploy/chaos/docker-compose.yml"},
		Gateway:  "http://127.0.0.1:18080",
		NATSURL:  "nats://127.0.0.1:14222",
		NATSURLs: "nats://127.0.0.1:14222,nats://127.0.0.1:14223,nats://127.0.0.1:14224",
		Monitor: map[string]string{
			"nats-1": "http://127.0.0.1:18222",
			"nats-2": "http://127.0.0.1:18223",
			"nats-3": "http://127.0.0.1:18224",
		},
	}
}

func (s *Stack) run(ctx context.Context, name string, args ...string) (string, error) {
	return s.runEnv(ctx, nil, name, args...)
}

// runEnv runs a command with env added to this process's environment.
func (s *Stack) runEnv(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = s.Root
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// ComposeRun runs a compose subcommand.
func (s *Stack) ComposeRun(ctx context.Context, args ...string) (string, error) {
	return s.run(ctx, s.Compose[0], append(append([]string{}, s.Compose[1:]...), args...)...)
}

// ComposeRunEnv runs a compose subcommand with env added, e.g. FLEETSTREAM_IMAGE_TAG=latest for
// an `up` that replaces a service's container by one of another image.
func (s *Stack) ComposeRunEnv(ctx context.Context, env []string, args ...string) (string, error) {
	return s.runEnv(ctx, env, s.Compose[0], append(append([]string{}, s.Compose[1:]...), args...)...)
}

// Container returns the id of a compose service's container.
func (s *Stack) Container(ctx context.Context, service string) (string, error) {
	id, err := s.ComposeRun(ctx, "ps", "-q", service)
	if err != nil {
		return "", err
	}
	if id == "" {
		return "", fmt.Errorf("service %s has no container", service)
	}
	return strings.Fields(id)[0], nil
}

// Kill stops a service's container with SIGKILL through Docker (docker kill): Docker does not
// restart it, Start does. It returns when docker kill returned: the container is dead then, and
// finding its id (a compose call that can take a second on a busy machine) is not counted.
func (s *Stack) Kill(ctx context.Context, service string) (time.Time, error) {
	id, err := s.Container(ctx, service)
	if err != nil {
		return time.Time{}, err
	}
	_, err = s.run(ctx, "docker", "kill", id)
	return time.Now(), err
}

// Start starts a service's stopped container again, with its volumes.
func (s *Stack) Start(ctx context.Context, service string) error {
	id, err := s.Container(ctx, service)
	if err != nil {
		return err
	}
	_, err = s.run(ctx, "docker", "start", id)
	return err
}

// Crash SIGKILLs the main process of a container from the host, as the kernel's OOM killer or a
// crash would: the container exits non-zero and its restart policy (on-failure) restarts it.
// It returns when the signal was sent (after docker inspect, which is not counted).
func (s *Stack) Crash(ctx context.Context, container string) (time.Time, error) {
	out, err := s.run(ctx, "docker", "inspect", "-f", "{{.State.Pid}}", container)
	if err != nil {
		return time.Time{}, err
	}
	pid, err := strconv.Atoi(out)
	if err != nil || pid <= 0 {
		return time.Time{}, fmt.Errorf("container %s: no process (pid %q)", container, out)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return time.Time{}, fmt.Errorf("kill -9 %d (container %s): %w", pid, container, err)
	}
	return time.Now(), nil
}

// Hostnames maps the hostname of every running container of the stack (what a service puts into
// its lease values) to the container id and its compose service.
func (s *Stack) Hostnames(ctx context.Context) (map[string][2]string, error) {
	ids, err := s.ComposeRun(ctx, "ps", "-q")
	if err != nil {
		return nil, err
	}
	out := map[string][2]string{}
	for _, id := range strings.Fields(ids) {
		line, err := s.run(ctx, "docker", "inspect", "-f", `{{.Config.Hostname}} {{index .Config.Labels "com.docker.compose.service"}}`, id)
		if err != nil {
			continue // gone meanwhile
		}
		f := strings.Fields(line)
		if len(f) == 2 {
			out[f[0]] = [2]string{id, f[1]}
		}
	}
	return out, nil
}

// Disconnect cuts a service's container off every network it is on and returns them, for
// Reconnect.
func (s *Stack) Disconnect(ctx context.Context, service string) (string, []string, error) {
	id, err := s.Container(ctx, service)
	if err != nil {
		return "", nil, err
	}
	out, err := s.run(ctx, "docker", "inspect", "-f", `{{json .NetworkSettings.Networks}}`, id)
	if err != nil {
		return "", nil, err
	}
	var nets map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &nets); err != nil {
		return "", nil, fmt.Errorf("networks of %s: %w", service, err)
	}
	var names []string
	for n := range nets {
		if _, err := s.run(ctx, "docker", "network", "disconnect", n, id); err != nil {
			return id, names, err
		}
		names = append(names, n)
	}
	return id, names, nil
}

// Reconnect undoes Disconnect.
func (s *Stack) Reconnect(ctx context.Context, id string, networks []string, alias string) error {
	for _, n := range networks {
		if _, err := s.run(ctx, "docker", "network", "connect", "--alias", alias, n, id); err != nil {
			return err
		}
	}
	return nil
}

// NATSHealthy reports whether a NATS node answers /healthz with 200: JetStream enabled and, for
// a clustered node, current with the meta leader and every stream and consumer it hosts.
func (s *Stack) NATSHealthy(ctx context.Context, node string) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Monitor[node]+"/healthz", nil)
	resp, err := (&http.Client{Timeout: 3 * time.Second}).Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// StreamLeaders returns, per stream, its leader node's server name and last sequence, from the
// first monitoring endpoint that answers.
func (s *Stack) StreamLeaders(ctx context.Context) (map[string]StreamState, error) {
	var lastErr error
	for _, node := range []string{"nats-1", "nats-2", "nats-3"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Monitor[node]+"/jsz?accounts=true&streams=true", nil)
		resp, err := (&http.Client{Timeout: 3 * time.Second}).Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		var jsz struct {
			Meta struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
			AccountDetails []struct {
				StreamDetail []struct {
					Name    string `json:"name"`
					Cluster struct {
						Leader string `json:"leader"`
					} `json:"cluster"`
					State struct {
						LastSeq uint64 `json:"last_seq"`
					} `json:"state"`
				} `json:"stream_detail"`
			} `json:"account_details"`
		}
		err = json.NewDecoder(resp.Body).Decode(&jsz)
		resp.Body.Close()
		if err != nil {
			lastErr = err
			continue
		}
		out := map[string]StreamState{}
		for _, a := range jsz.AccountDetails {
			for _, sd := range a.StreamDetail {
				out[sd.Name] = StreamState{Leader: sd.Cluster.Leader, LastSeq: sd.State.LastSeq}
			}
		}
		if len(out) > 0 {
			// The JetStream meta group (stream and consumer assignments: every new consumer,
			// a restarted watch's included, waits for its leader) under a name no stream has.
			out[MetaGroup] = StreamState{Leader: jsz.Meta.Leader}
			return out, nil
		}
		lastErr = fmt.Errorf("%s: no streams in /jsz", node)
	}
	return nil, fmt.Errorf("stream leaders: %w", lastErr)
}

// WatchElections polls the surviving nodes' /jsz every 100 ms, for at most d, and returns how
// long after t0 each of streams (led by the dead node) first showed another leader. The
// monitoring endpoint's view lags the election by at most one poll and one request.
func (s *Stack) WatchElections(ctx context.Context, dead string, streams []string, t0 time.Time, d time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	deadline := t0.Add(d)
	for len(out) < len(streams) && time.Now().Before(deadline) {
		if leaders, err := s.StreamLeaders(ctx); err == nil {
			at := time.Since(t0)
			for _, name := range streams {
				if _, done := out[name]; done {
					continue
				}
				if l := leaders[name].Leader; l != "" && l != dead {
					out[name] = at
				}
			}
		}
		select {
		case <-ctx.Done():
			return out
		case <-time.After(100 * time.Millisecond):
		}
	}
	if rest := time.Until(deadline); rest > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(rest):
		}
	}
	return out
}

// WatchWritable times when each of buckets (KV buckets' stream names, KV_<bucket>, that the
// dead node led) takes writes again, as a bare nats.go writer sees it: every 100 ms it sends a
// write the bucket's leader must process but that stores nothing (a put to key chaos-probe
// expecting an impossible last sequence), over each conn (the hub services' own identities: a
// bucket answers only the ones allowed to write it), until the leader answers "wrong last
// sequence". A new leader shown in /jsz may still refuse writes for seconds (catching up);
// this is the moment the API's writes can resume at the earliest. Returns how long after t0
// each bucket first answered, within d.
func (s *Stack) WatchWritable(ctx context.Context, conns []*nats.Conn, buckets []string, t0 time.Time, d time.Duration) map[string]time.Duration {
	ctx, cancel := context.WithDeadline(ctx, t0.Add(d))
	defer cancel()
	var (
		mu  sync.Mutex
		out = map[string]time.Duration{}
		wg  sync.WaitGroup
	)
	for _, stream := range buckets {
		bucket, ok := strings.CutPrefix(stream, "KV_")
		if !ok {
			continue
		}
		bctx, done := context.WithCancel(ctx)
		for _, nc := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msg := nats.NewMsg("$KV." + bucket + ".chaos-probe")
				msg.Header.Set(jetstream.ExpectedLastSeqHeader, "4611686018427387904")
				for bctx.Err() == nil {
					rctx, rcancel := context.WithTimeout(bctx, 500*time.Millisecond)
					resp, err := nc.RequestMsgWithContext(rctx, msg)
					rcancel()
					if err == nil && strings.Contains(string(resp.Data), `"err_code":10071`) {
						mu.Lock()
						if _, seen := out[stream]; !seen {
							out[stream] = time.Since(t0)
						}
						mu.Unlock()
						done()
						return
					}
					select {
					case <-bctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
				}
			}()
		}
		defer done()
	}
	wg.Wait()
	return out
}

// MetaGroup is the JetStream meta group's entry in StreamLeaders.
const MetaGroup = "$META"

// StreamState is one stream as its leader reports it.
type StreamState struct {
	Leader  string
	LastSeq uint64
}

// Secret reads a dev secret of the stack (.data/compose/...).
func (s *Stack) Secret(rel string) (string, error) {
	b, err := os.ReadFile(filepath.Join(s.Root, ".data/compose", rel))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// GatewayReady returns nil when the gateway's /readyz answers 200 (it reaches every service).
func (s *Stack) GatewayReady(ctx context.Context) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Gateway+"/readyz", nil)
	resp, err := (&http.Client{Timeout: 3 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("gateway /readyz: %s", resp.Status)
	}
	return nil
}

// Fleetctl runs the repository's bin/fleetctl (tools/scripts/compose-members.sh builds it) in
// the root and returns its output.
func (s *Stack) Fleetctl(ctx context.Context, args ...string) (string, error) {
	return s.run(ctx, filepath.Join(s.Root, "bin", "fleetctl"), args...)
}

// AdminNATSFlags are fleetctl admin's flags for the stack's NATS as fleetstream-admin, the
// static user of backups and restores (deploy/nats/auth.conf).
func (s *Stack) AdminNATSFlags() []string {
	return []string{"--nats-url", s.NATSURLs, "--nats-user", "fleetstream-admin",
		"--nats-token-file", filepath.Join(s.Root, ".data/compose/nats/admin.password")}
}

// Volume returns the name of the Docker volume mounted at dest in a service's container.
func (s *Stack) Volume(ctx context.Context, service, dest string) (string, error) {
	id, err := s.Container(ctx, service)
	if err != nil {
		return "", err
	}
	out, err := s.run(ctx, "docker", "inspect", "-f", `{{range .Mounts}}{{if eq .Destination "`+dest+`"}}{{.Name}}{{end}}{{end}}`, id)
	if err != nil {
		return "", err
	}
	if out == "" {
		return "", fmt.Errorf("service %s: no volume at %s", service, dest)
	}
	return out, nil
}

// Docker runs a docker command.
func (s *Stack) Docker(ctx context.Context, args ...string) (string, error) {
	return s.run(ctx, "docker", args...)
}

// NATSNodes are the stack's NATS services.
var NATSNodes = []string{"nats-1", "nats-2", "nats-3"}

// MemberServices are the member clusters' own containers: not the hub's, they keep running
// whatever the hub goes through.
var MemberServices = []string{"east-etcd", "east-apiserver", "east-agent", "west-etcd", "west-apiserver", "west-agent"}

// HubServices lists the stack's services other than NATS and the members': every hub service's
// replicas, the gateway and the hosted agents.
func (s *Stack) HubServices(ctx context.Context) ([]string, error) {
	out, err := s.ComposeRun(ctx, "config", "--services")
	if err != nil {
		return nil, err
	}
	skip := map[string]bool{}
	for _, n := range append(append([]string{}, NATSNodes...), MemberServices...) {
		skip[n] = true
	}
	var hub []string
	for _, sv := range strings.Fields(out) {
		if !skip[sv] {
			hub = append(hub, sv)
		}
	}
	return hub, nil
}

// ImageOf returns the image reference a service's container was created from
// (fleetstream/cluster-import:previous) and that image's id.
func (s *Stack) ImageOf(ctx context.Context, service string) (ref, id string, err error) {
	c, err := s.Container(ctx, service)
	if err != nil {
		return "", "", err
	}
	out, err := s.run(ctx, "docker", "inspect", "-f", "{{.Config.Image}} {{.Image}}", c)
	if err != nil {
		return "", "", err
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return "", "", fmt.Errorf("service %s: image %q", service, out)
	}
	return f[0], f[1], nil
}

// ImageID returns the id of a local image.
func (s *Stack) ImageID(ctx context.Context, ref string) (string, error) {
	return s.run(ctx, "docker", "image", "inspect", "-f", "{{.Id}}", ref)
}

// Ready returns nil when a hub service's container answers /readyz with 200 on its own address
// in the stack's network (the host reaches a container's address on Docker Engine for Linux), so
// a replica that publishes no port is checked too.
func (s *Stack) Ready(ctx context.Context, service string) error {
	c, err := s.Container(ctx, service)
	if err != nil {
		return err
	}
	ip, err := s.run(ctx, "docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", c)
	if err != nil {
		return err
	}
	f := strings.Fields(ip)
	if len(f) == 0 {
		return fmt.Errorf("service %s: no address yet", service)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f[0]+":8080/readyz", nil)
	resp, err := (&http.Client{Timeout: 3 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s /readyz: %s", service, resp.Status)
	}
	return nil
}
