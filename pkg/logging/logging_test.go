package logging_test

import (
	"bufio"
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/logging"
)

// Every access-log line of a busy gateway reaches the log: 1,000 lines with the same message
// within a second are all written (zap's production sampling kept 100 and then one in 100).
func TestEveryRepeatedLineIsWritten(t *testing.T) {
	for _, dev := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "log")
		cfg, err := logging.Config("info", dev)
		if err != nil {
			t.Fatal(err)
		}
		cfg.OutputPaths = []string{path}
		log, err := cfg.Build()
		if err != nil {
			t.Fatal(err)
		}
		const n = 1000
		for i := 0; i < n; i++ {
			log.Info("request")
		}
		log.Debug("not at info")
		_ = log.Sync()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := 0
		for sc := bufio.NewScanner(f); sc.Scan(); {
			lines++
		}
		_ = f.Close()
		if lines != n {
			t.Errorf("development %v: %d lines written, want %d", dev, lines, n)
		}
	}
	if _, err := logging.Config("loud", false); err == nil {
		t.Error("an unknown level was accepted")
	}
}
