package fleetd

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/sealed"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// DefaultCredentialsKeyFile is where fleetd keeps the key that seals cluster credentials when
// --credentials-key-file is not given: created on first start, so `make run` needs no step.
func DefaultCredentialsKeyFile(dataDir string) string {
	return filepath.Join(dataDir, "credentials.key")
}

// credentialsKeyring loads the key file, creating the default one (mode 0600) on first start.
// A given --credentials-key-file must exist: a typo must not silently start a new key.
func credentialsKeyring(dataDir, keyFile string, log *zap.Logger) (*sealed.Keyring, error) {
	if keyFile == "" {
		keyFile = DefaultCredentialsKeyFile(dataDir)
		id, err := sealed.CreateKeyFile(keyFile, time.Now())
		switch {
		case err == nil:
			log.Info("created the key that seals cluster credentials; back it up with the data dir", zap.String("file", keyFile), zap.String("key_id", id))
		case !errors.Is(err, fs.ErrExist):
			return nil, fmt.Errorf("fleetd: %w", err)
		}
	}
	ring, err := sealed.LoadKeyring(keyFile)
	if err != nil {
		return nil, fmt.Errorf("fleetd: --credentials-key-file: %w", err)
	}
	return ring, nil
}

// RotateConfig says which data dir and key file to rotate.
type RotateConfig struct {
	DataDir string
	// KeyFile is --credentials-key-file; empty means the data dir's default one.
	KeyFile string
	// NewKey first adds a freshly generated key as the key file's first line.
	NewKey bool
}

// RotateResult is what a rotation did; it never holds a value.
type RotateResult struct {
	KeyFile string
	// AddedKeyID is the key NewKey added, if any.
	AddedKeyID string
	Report     clusterimport.ResealReport
	// OldKeyIDs are the key file's other keys: after a successful rotation no stored value
	// needs them and their lines can be deleted.
	OldKeyIDs []string
}

// RotateCredentialsKey reseals every stored cluster credential value with the key file's first
// key. It runs against a stopped fleetd's data dir: it takes the data dir's lock (so it fails
// while fleetd runs) and starts the embedded JetStream server on it, reachable in-process only
// in practice (loopback, random port, a token that lives in this process).
func RotateCredentialsKey(ctx context.Context, cfg RotateConfig, log *zap.Logger) (*RotateResult, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("--data-dir is required")
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "jetstream")); err != nil {
		return nil, fmt.Errorf("data dir %s holds no fleetd state: %w", cfg.DataDir, err)
	}
	res := &RotateResult{KeyFile: cfg.KeyFile}
	if res.KeyFile == "" {
		res.KeyFile = DefaultCredentialsKeyFile(cfg.DataDir)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer func() { _ = lock.Close() }()
	if cfg.NewKey {
		if res.AddedKeyID, err = sealed.PrependNewKey(res.KeyFile, time.Now()); err != nil {
			return nil, err
		}
	}
	ring, err := sealed.LoadKeyring(res.KeyFile)
	if err != nil {
		return res, err
	}
	res.OldKeyIDs = ring.IDs()[1:]
	token, err := randomToken()
	if err != nil {
		return res, err
	}
	ns, err := natsembed.Start(natsembed.Config{
		Name: "fleetd", StoreDir: filepath.Join(cfg.DataDir, "jetstream"), Port: -1, Logger: log.Named("nats"),
		Auth: tokenAuth(token),
	})
	if err != nil {
		return res, fmt.Errorf("start the embedded server on %s: %w", cfg.DataDir, err)
	}
	defer ns.Stop()
	nc, err := nats.Connect("", nats.InProcessServer(ns), nats.Name("fleetd-rotate"), nats.Token(token))
	if err != nil {
		return res, fmt.Errorf("connect to the embedded server: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return res, err
	}
	res.Report, err = clusterimport.Reseal(ctx, js, ring, log)
	return res, err
}

// tokenAuth admits only the one connection that knows token, with full access.
type tokenAuth string

func (t tokenAuth) Check(c server.ClientAuthentication) bool {
	if subtle.ConstantTimeCompare([]byte(c.GetOpts().Token), []byte(t)) != 1 {
		return false
	}
	c.RegisterUser(&server.User{Username: "fleetd-rotate"})
	return true
}
