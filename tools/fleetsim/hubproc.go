package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// childHub runs fleetd (the binary at path) as a child process, so that what the hub costs —
// its CPU, its memory — is measured apart from the simulated agents (-fleetd), and so that it
// can be restarted on the same data and ports (the storm scenario).
type childHub struct {
	path    string
	args    []string
	dir     string
	apiURL  string
	natsURL string
	// xdsAddr is where the hub serves xDS (host:port).
	xdsAddr string
	// pprofURL serves the hub's /debug/pprof/ ("" unless asked for).
	pprofURL string
	// exited receives why fleetd stopped when nobody asked it to.
	exited chan error

	mu       sync.Mutex
	cmd      *exec.Cmd
	procDone chan struct{}
	stopping bool
}

func startChildHub(ctx context.Context, path, token string, pprof bool) (*childHub, error) {
	dir, err := os.MkdirTemp("", "fleetsim-hub-")
	if err != nil {
		return nil, err
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(token+",admin\n"), 0o600); err != nil {
		return nil, err
	}
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	api, nats := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	// Its own xDS port too: fleetd's default (18000) is shared by every hub on the machine.
	xds := fmt.Sprintf("127.0.0.1:%d", ports[3])
	h := &childHub{path: path, dir: dir, apiURL: "http://" + api, natsURL: "nats://" + nats, xdsAddr: xds, exited: make(chan error, 1),
		args: []string{"--data-dir", filepath.Join(dir, "data"), "--listen", api,
			"--nats-listen", nats, "--xds-listen", xds, "--token-file", tokens, "--platform-admins", "admin", "--log-level", "error"}}
	if pprof {
		addr := fmt.Sprintf("127.0.0.1:%d", ports[2])
		h.args, h.pprofURL = append(h.args, "--pprof-listen", addr), "http://"+addr
	}
	if err := h.launch(ctx, 60*time.Second); err != nil {
		h.stop()
		return nil, err
	}
	return h, nil
}

// launch starts fleetd and waits until it is ready, at most patience.
func (h *childHub) launch(ctx context.Context, patience time.Duration) error {
	cmd := exec.Command(h.path, h.args...)
	logf, err := os.OpenFile(filepath.Join(h.dir, "fleetd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start %s: %w", h.path, err)
	}
	done := make(chan struct{})
	h.mu.Lock()
	h.cmd, h.procDone, h.stopping = cmd, done, false
	h.mu.Unlock()
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		h.mu.Lock()
		unexpected := !h.stopping
		h.mu.Unlock()
		if unexpected {
			select {
			case h.exited <- fmt.Errorf("fleetd exited: %v; its log ends:\n%s", err, logTail(filepath.Join(h.dir, "fleetd.log"), 20)):
			default:
			}
		}
		close(done)
	}()
	deadline := time.After(patience)
	for {
		resp, err := http.Get(h.apiURL + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			return fmt.Errorf("fleetd exited before it was ready; its log ends:\n%s", logTail(filepath.Join(h.dir, "fleetd.log"), 20))
		case <-deadline:
			return fmt.Errorf("fleetd not ready within %s", patience)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// pid is the running fleetd's process id.
func (h *childHub) pid() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strconv.Itoa(h.cmd.Process.Pid)
}

// terminate stops fleetd (SIGTERM, then SIGKILL after 30 s) and waits for it.
func (h *childHub) terminate() {
	h.mu.Lock()
	cmd, done := h.cmd, h.procDone
	h.stopping = true
	h.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// restart stops fleetd and starts it again on the same data directory and ports.
// restart stops fleetd and starts it again on the same data and ports; a hub restarted under a
// large fleet (it recovers its streams while every agent knocks) may take minutes to be ready,
// hence patience.
func (h *childHub) restart(ctx context.Context, patience time.Duration) error {
	h.terminate()
	return h.launch(ctx, patience)
}

func (h *childHub) stop() {
	h.terminate()
	_ = os.RemoveAll(h.dir)
}

func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// procUsage is a process's CPU time so far and its resident memory (Linux /proc).
type procUsage struct {
	cpu   time.Duration
	rssMB float64
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every Linux port Go runs on.
const clockTicks = 100

func readUsage(pid string) (procUsage, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return procUsage{}, err
	}
	// The command name (field 2) may hold spaces: fields are counted after its closing paren.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 22 {
		return procUsage{}, fmt.Errorf("/proc/%s/stat: %d fields", pid, len(f))
	}
	utime, _ := strconv.ParseUint(f[11], 10, 64)
	stime, _ := strconv.ParseUint(f[12], 10, 64)
	rssPages, _ := strconv.ParseUint(f[21], 10, 64)
	return procUsage{
		cpu:   time.Duration(utime+stime) * time.Second / clockTicks,
		rssMB: float64(rssPages*uint64(os.Getpagesize())) / (1 << 20),
	}, nil
}

// cpuProfile saves a CPU profile of the child hub over d into file. The file is created before
// the request: at 10,000 clusters the simulator's connections leave few descriptors, and a
// profile fetched for 30 s and then refused a file (EMFILE) is lost.
func (h *childHub) cpuProfile(ctx context.Context, d time.Duration, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := h.cpuProfileTo(ctx, d, f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// cpuProfileTo writes a CPU profile of the child hub over d to w.
func (h *childHub) cpuProfileTo(ctx context.Context, d time.Duration, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", h.pprofURL, int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("hub CPU profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("hub CPU profile: %s", resp.Status)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// cpuProfileOfNext waits for the fleetd started after the one with process id old, and saves a
// CPU profile of it over d into file, from as soon as it serves its profiles: the agents
// reconnect to its NATS server before it is ready. The file is created first, before the
// storm's reconnections take the descriptors.
func (h *childHub) cpuProfileOfNext(ctx context.Context, old string, d time.Duration, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	for h.pid() == old {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		err := h.cpuProfileTo(ctx, d, f)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return err
			}
			return f.Close()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logTail returns the last n lines of the file at path (the hub's log is removed with its
// directory when fleetsim ends).
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
