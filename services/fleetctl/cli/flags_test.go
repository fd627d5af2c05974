package cli

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
)

func TestParseKeyValues(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		want    map[string]string
		wantErr string
	}{
		{name: "none", in: nil, want: map[string]string{}},
		{name: "pairs", in: []string{"env=prod", "fleetstream.io/tier=gold"}, want: map[string]string{"env": "prod", "fleetstream.io/tier": "gold"}},
		{name: "empty value", in: []string{"env="}, want: map[string]string{"env": ""}},
		{name: "value with =", in: []string{"note=a=b"}, want: map[string]string{"note": "a=b"}},
		{name: "no =", in: []string{"env"}, wantErr: `--label "env": want key=value`},
		{name: "empty key", in: []string{"=prod"}, wantErr: `--label "=prod": want key=value`},
		{name: "empty", in: []string{""}, wantErr: `want key=value`},
		{name: "duplicate", in: []string{"env=a", "env=b"}, wantErr: `key "env" given twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseKeyValues("label", tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestParseTaints(t *testing.T) {
	taint := func(k, v string, e clusterv1.TaintEffect) *clusterv1.Taint {
		return &clusterv1.Taint{Key: k, Value: v, Effect: e}
	}
	tests := []struct {
		name    string
		in      []string
		want    []*clusterv1.Taint
		wantErr string
	}{
		{name: "key value effect", in: []string{"maintenance=true:NoSelect"}, want: []*clusterv1.Taint{taint("maintenance", "true", clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT)}},
		{name: "no value", in: []string{"fleetstream.io/unreachable:NoSelectIfNew"}, want: []*clusterv1.Taint{taint("fleetstream.io/unreachable", "", clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT_IF_NEW)}},
		{name: "case-insensitive and enum name", in: []string{"a:prefernoselect", "b:TAINT_EFFECT_NO_SELECT"}, want: []*clusterv1.Taint{
			taint("a", "", clusterv1.TaintEffect_TAINT_EFFECT_PREFER_NO_SELECT),
			taint("b", "", clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT),
		}},
		{name: "same key different effects", in: []string{"a:NoSelect", "a:PreferNoSelect"}, want: []*clusterv1.Taint{
			taint("a", "", clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT),
			taint("a", "", clusterv1.TaintEffect_TAINT_EFFECT_PREFER_NO_SELECT),
		}},
		{name: "missing effect", in: []string{"a=b"}, wantErr: "want key=value:Effect"},
		{name: "empty effect", in: []string{"a=b:"}, wantErr: "want key=value:Effect"},
		{name: "unknown effect", in: []string{"a=b:NoSchedule"}, wantErr: `unknown effect "NoSchedule", want one of NoSelect, NoSelectIfNew, PreferNoSelect`},
		{name: "unspecified is not an effect", in: []string{"a:Unspecified"}, wantErr: "unknown effect"},
		{name: "empty key", in: []string{"=b:NoSelect"}, wantErr: "empty key"},
		{name: "duplicate", in: []string{"a=1:NoSelect", "a=2:noselect"}, wantErr: "given twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTaints(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if !proto.Equal(got[i], tt.want[i]) {
					t.Fatalf("taint %d = %v, want %v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestFormatTaintRoundTrip(t *testing.T) {
	for _, s := range []string{"a=b:NoSelect", "fleetstream.io/unreachable:NoSelectIfNew", "x=1:PreferNoSelect"} {
		taints, err := parseTaints([]string{s})
		if err != nil {
			t.Fatal(err)
		}
		if got := formatTaint(taints[0]); got != s {
			t.Errorf("formatTaint(parseTaints(%q)) = %q", s, got)
		}
	}
}

// TestUpdateMask checks that update names exactly the fields whose flags were given, and that
// an empty flag value clears a field instead of failing.
func TestUpdateMask(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantPaths []string
		check     func(t *testing.T, req *clusterv1.UpdateClusterRequest)
		wantErr   string
	}{
		{name: "labels only", args: []string{"--label", "env=prod", "--label", "tier=gold"}, wantPaths: []string{"labels"},
			check: func(t *testing.T, req *clusterv1.UpdateClusterRequest) {
				if len(req.Labels) != 2 || req.Labels["tier"] != "gold" {
					t.Errorf("labels = %v", req.Labels)
				}
			}},
		{name: "claims and taints", args: []string{"--claim", "region=eu", "--taint", "a:NoSelect"}, wantPaths: []string{"claims", "taints"}},
		{name: "clear taints", args: []string{"--taint="}, wantPaths: []string{"taints"},
			check: func(t *testing.T, req *clusterv1.UpdateClusterRequest) {
				if len(req.Taints) != 0 {
					t.Errorf("taints = %v", req.Taints)
				}
			}},
		{name: "nothing", args: nil, wantErr: "nothing to update"},
		{name: "bad label", args: []string{"--label", "env"}, wantErr: "want key=value"},
		{name: "bad taint", args: []string{"--taint", "a:Sometimes"}, wantErr: "unknown effect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &factory{}
			cmd := &cobra.Command{Use: "update"}
			var flags clusterFlags
			flags.add(cmd, "")
			if err := cmd.ParseFlags(tt.args); err != nil {
				t.Fatal(err)
			}
			req, err := buildUpdateRequest(cmd, f, &flags, "c1")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(req.GetUpdateMask().GetPaths(), ","); got != strings.Join(tt.wantPaths, ",") {
				t.Errorf("update_mask = %s, want %s", got, strings.Join(tt.wantPaths, ","))
			}
			if tt.check != nil {
				tt.check(t, req)
			}
		})
	}
}
