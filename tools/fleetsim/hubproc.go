package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// childHub runs fleetd (the binary at path) as a child process, so that what the hub costs —
// its CPU, its memory — is measured apart from the simulated agents (-fleetd).
type childHub struct {
	cmd     *exec.Cmd
	dir     string
	apiURL  string
	natsURL string
	// pprofURL serves the hub's /debug/pprof/ ("" unless asked for).
	pprofURL string
	exited   chan error
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
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	api, nats := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	args := []string{"--data-dir", filepath.Join(dir, "data"), "--listen", api,
		"--nats-listen", nats, "--token-file", tokens, "--platform-admins", "admin", "--log-level", "error"}
	pprofURL := ""
	if pprof {
		addr := fmt.Sprintf("127.0.0.1:%d", ports[2])
		args, pprofURL = append(args, "--pprof-listen", addr), "http://"+addr
	}
	cmd := exec.Command(path, args...)
	logf, err := os.Create(filepath.Join(dir, "fleetd.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	h := &childHub{cmd: cmd, dir: dir, apiURL: "http://" + api, natsURL: "nats://" + nats, pprofURL: pprofURL, exited: make(chan error, 1)}
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		h.exited <- fmt.Errorf("fleetd exited: %v (log %s)", err, filepath.Join(dir, "fleetd.log"))
	}()
	deadline := time.After(60 * time.Second)
	for {
		resp, err := http.Get(h.apiURL + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return h, nil
			}
		}
		select {
		case err := <-h.exited:
			return nil, err
		case <-deadline:
			h.stop()
			return nil, errors.New("fleetd not ready within 60s")
		case <-ctx.Done():
			h.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (h *childHub) stop() {
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(30 * time.Second):
		_ = h.cmd.Process.Kill()
		<-h.exited
	}
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

// cpuProfile saves a CPU profile of the child hub over d into file.
func (h *childHub) cpuProfile(ctx context.Context, d time.Duration, file string) error {
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
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
