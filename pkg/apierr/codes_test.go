package apierr

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
)

// The shared answers carry the codes clients act on: Unavailable and Aborted are retryable,
// ResourceExhausted ends a watch that must be restarted, the rest are final.
func TestSharedAnswers(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code connect.Code
		msg  string
	}{
		{Starting("rbac-sync"), connect.CodeUnavailable, "rbac-sync is starting"},
		{NotYetVisible("weight", errors.New("timeout")), connect.CodeUnavailable, "weight accepted but not yet visible: timeout"},
		{RevisionMismatch("placement", "team-a/web", 7, 5), connect.CodeAborted, `placement "team-a/web" is at revision 7, not 5`},
		{Concurrent("cluster set %q", "prod"), connect.CodeAborted, `cluster set "prod" changed concurrently; read it again`},
		{Aborted("project %s is busy", "p"), connect.CodeAborted, "project p is busy"},
		{WatchFellBehind("clusters"), connect.CodeResourceExhausted, "watch of clusters fell behind; watch again"},
		{NotFoundf("service %s has no endpoint", "a/b"), connect.CodeNotFound, "service a/b has no endpoint"},
		{AlreadyExistsf("namespace %q is bound", "web"), connect.CodeAlreadyExists, `namespace "web" is bound`},
		{PermissionDenied("user %q may not", "bob"), connect.CodePermissionDenied, `user "bob" may not`},
		{Unauthenticated(errors.New("token expired")), connect.CodeUnauthenticated, "token expired"},
		{Unavailablef("identity provider down"), connect.CodeUnavailable, "identity provider down"},
		{FailedPrecondition("built in"), connect.CodeFailedPrecondition, "built in"},
		{NotFound("project", "p"), connect.CodeNotFound, `project "p" not found`},
		{AlreadyExists("project", "p"), connect.CodeAlreadyExists, `project "p" already exists`},
	} {
		var ce *connect.Error
		if !errors.As(tc.err, &ce) || ce.Code() != tc.code || ce.Message() != tc.msg {
			t.Errorf("%v: code %v message %q; want %v %q", tc.err, connect.CodeOf(tc.err), ce.Message(), tc.code, tc.msg)
		}
	}
}

// Every Connect error the services return is made here: a handler that builds its own could
// pick a code or wording that disagrees with the other services'.
func TestNoConnectErrorsBuiltElsewhere(t *testing.T) {
	root := filepath.Join("..", "..")
	var offenders []string
	for _, dir := range []string{"pkg", "services", "examples"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "gen" || d.Name() == "apierr" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if strings.Contains(string(src), "connect.NewError(") {
				offenders = append(offenders, path)
			}
			return nil
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	}
	if len(offenders) > 0 {
		t.Errorf("connect.NewError outside pkg/apierr (use an apierr constructor): %s", strings.Join(offenders, ", "))
	}
}
