package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Runs at two sizes become one panel per figure they have, with a point per run; a maximum
// standing in for a p99 (fewer than 200 samples) is drawn hollow; a figure no run has is left
// out.
func TestPlotDrawsEachFigureAgainstN(t *testing.T) {
	results := filepath.Join(t.TempDir(), "r.jsonl")
	lines := `{"clusters":100,"grant":{"grant":{"n":100,"p50_ms":30,"max_ms":70},"revoke":{"n":100,"p50_ms":20,"max_ms":60}},"steady":{"hub_cpu_percent_of_a_core":5,"hub_rss_mb":160}}
{"clusters":200,"grant":{"grant":{"n":1000,"p50_ms":40,"p99_ms":90,"max_ms":120},"revoke":{"n":1000,"p50_ms":25,"p99_ms":80,"max_ms":90}},"steady":{"hub_cpu_percent_of_a_core":8,"hub_rss_mb":210}}
`
	if err := os.WriteFile(results, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{results}, &out); err != nil {
		t.Fatal(err)
	}
	svg := out.String()
	for _, want := range []string{"grant → RoleBinding applied", "revoke → RoleBinding removed", "idle hub CPU", "hub RSS", `fill="white" stroke="#d62728"`, ">100<", ">200<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	for _, absent := range []string{"placement:", "registration call"} {
		if strings.Contains(svg, absent) {
			t.Errorf("SVG has a panel %q no run measured", absent)
		}
	}
	if err := run([]string{filepath.Join(t.TempDir(), "none.jsonl")}, &out); err == nil {
		t.Error("a missing results file was not an error")
	}
}
