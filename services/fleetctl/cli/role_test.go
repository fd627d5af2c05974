package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// A template file with a field a RoleTemplate does not have is refused before anything is sent
// (the server URL points nowhere): it used to be dropped, and "rule:" for "rules:" made a
// template without rules.
func TestRoleFileRefusesUnknownFields(t *testing.T) {
	file := filepath.Join(t.TempDir(), "role.yaml")
	writeFile(t, file, "name: pod-reader\nrule:\n- verbs: [get]\n  resources: [pods]\n")
	var out, errOut bytes.Buffer
	code := Run(context.Background(), IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
		[]string{"--server", "http://127.0.0.1:1", "--token", "x", "role", "create", "-f", file})
	if code != 1 || !strings.Contains(errOut.String(), "parse "+file) || !strings.Contains(errOut.String(), `unknown field "rule"`) {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
}
