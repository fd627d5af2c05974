// Package backup writes a backup of every JetStream stream of a Fleetstream hub (event streams,
// KV buckets, object stores) into a directory and restores it onto another NATS, with
// JetStream's own snapshot and restore API driven by github.com/nats-io/jsm.go (what the nats
// CLI uses): the server writes each stream's snapshot consistently while it keeps serving, and
// this package adds what a whole-hub restore needs on top: a manifest with the Fleetstream
// version, each stream's configuration and position, and checksums of every file, which a
// restore checks in full before it restores anything.
//
// Layout of a backup directory:
//
//	manifest.json                      Manifest, written last: a directory without it is no backup
//	streams/<STREAM>/backup.json       the stream's configuration and state (jsm.go's meta file)
//	streams/<STREAM>/stream.arc.s2     the server's snapshot (s2-compressed NATSARC1 archive)
package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jsm.go"
	"github.com/nats-io/jsm.go/api"
	jsmbackup "github.com/nats-io/jsm.go/backup"
	"github.com/nats-io/nats.go"

	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// Format is the version of the backup layout and manifest this package writes. A restore
// refuses a backup of a newer format: it cannot know what that backup needs.
const Format = 1

// ManifestFile is the manifest's name in a backup directory.
const ManifestFile = "manifest.json"

// StreamsDir holds one directory per stream.
const StreamsDir = "streams"

// BlockSize is the span of each block checksum: a corrupted file is reported with the offset of
// its first bad block, not only as "the checksum differs".
const BlockSize = 1 << 20

// Manifest describes a backup.
type Manifest struct {
	// Format is the backup format (Format when written by this package).
	Format int `json:"format"`
	// FleetstreamVersion is the version of the binary that wrote the backup (pkg/version).
	FleetstreamVersion string `json:"fleetstreamVersion"`
	// NATSServerVersion is the version of the server the snapshots were taken from.
	NATSServerVersion string `json:"natsServerVersion"`
	// Started and Finished bracket the backup; every stream's snapshot was taken in between.
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Streams in the order they were snapshotted, which is the order they are restored in.
	Streams []Stream `json:"streams"`
}

// Stream is one stream of a backup.
type Stream struct {
	Name string `json:"name"`
	// Config is the stream's configuration when it was snapshotted.
	Config api.StreamConfig `json:"config"`
	// FirstSeq, LastSeq, Msgs and Bytes are the stream's state the snapshot holds: every
	// message stored up to LastSeq when the snapshot began, and nothing after.
	FirstSeq uint64 `json:"firstSeq"`
	LastSeq  uint64 `json:"lastSeq"`
	Msgs     uint64 `json:"msgs"`
	Bytes    uint64 `json:"bytes"`
	// Files are the stream directory's files with their sizes and checksums.
	Files []File `json:"files"`
}

// File is one file of a stream's directory.
type File struct {
	// Name within the stream's directory (jsm.SnapshotMetaFile or jsm.SnapshotDataFile).
	Name string `json:"name"`
	Size int64  `json:"size"`
	// SHA256 of the whole file, hex.
	SHA256 string `json:"sha256"`
	// Blocks are the SHA-256 (hex) of each BlockSize bytes of the file, in order.
	Blocks []string `json:"blocks"`
}

// Options tune a backup or a restore.
type Options struct {
	// Version is the Fleetstream version written into (or checked against) the manifest.
	Version string
	// Timeout bounds each JetStream API request (0: 30 s). A restore's final step, where the
	// server rebuilds the stream, has its own hour-long bound (jsm.go's).
	Timeout time.Duration
	// Progress, when set, is called after each stream.
	Progress func(Stream, time.Duration)
}

func (o Options) manager(nc *nats.Conn) (*jsm.Manager, error) {
	timeout := o.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	return jsm.New(nc, jsm.WithTimeout(timeout))
}

// order sorts the streams so that what is derived from other streams is snapshotted before its
// sources. JetStream snapshots one stream at a time, so a backup is consistent per stream, not
// across streams; but a view's checkpoint (a KV bucket) must never be ahead of the events it was
// built from, or a restored view would skip the events appended after the restore at the
// sequences it thinks it applied. Snapshotting derived state first keeps every recorded
// position at or behind its source's, which the views then catch up from, as after any restart:
// KV buckets first (views, their checkpoints, the audit index's checkpoints), then the audit
// index (derived from the event streams), then everything else.
func order(names []string) []string {
	rank := func(n string) int {
		switch {
		case strings.HasPrefix(n, "KV_"):
			return 0
		case n == subjects.AuditStream:
			return 1
		}
		return 2
	}
	out := slices.Clone(names)
	slices.SortStableFunc(out, func(a, b string) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	return out
}

// Backup writes a backup of every stream the connection's account holds into dir, which must
// not exist or be empty. The fleet keeps serving meanwhile: each stream's snapshot holds what
// the stream stored when its snapshot began. The manifest is written last, so an interrupted
// backup leaves a directory that a restore refuses.
func Backup(ctx context.Context, nc *nats.Conn, dir string, opts Options) (*Manifest, error) {
	if err := emptyDir(dir); err != nil {
		return nil, err
	}
	mgr, err := opts.manager(nc)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	names, err := mgr.StreamNames(nil)
	if err != nil {
		return nil, fmt.Errorf("backup: list streams: %w", err)
	}
	m := &Manifest{Format: Format, FleetstreamVersion: opts.Version, NATSServerVersion: nc.ConnectedServerVersion(), Started: time.Now().UTC()}
	for _, name := range order(names) {
		start := time.Now()
		s, err := backupStream(ctx, mgr, dir, name)
		if err != nil {
			return nil, err
		}
		m.Streams = append(m.Streams, *s)
		if opts.Progress != nil {
			opts.Progress(*s, time.Since(start))
		}
	}
	m.Finished = time.Now().UTC()
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("backup: manifest: %w", err)
	}
	if err := writeFileSync(filepath.Join(dir, ManifestFile), append(data, '\n')); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	return m, nil
}

func backupStream(ctx context.Context, mgr *jsm.Manager, dir, name string) (*Stream, error) {
	if !jsm.IsValidName(name) {
		return nil, fmt.Errorf("backup: stream name %q cannot be a directory name", name)
	}
	st, err := mgr.LoadStream(name)
	if err != nil {
		return nil, fmt.Errorf("backup: stream %s: %w", name, err)
	}
	sdir := filepath.Join(dir, StreamsDir, name)
	var (
		meta *metaFile
		info *jsmbackup.InfoReport
	)
	for attempt := 1; ; attempt++ {
		if meta, info, err = snapshotOnce(ctx, st, sdir); err != nil {
			return nil, err
		}
		torn := tornSnapshot(meta.Config, info)
		if torn == "" {
			break
		}
		if attempt == snapshotAttempts {
			return nil, fmt.Errorf("backup: stream %s: %d snapshots in a row lost messages replaced while they were taken "+
				"(the last %s); the stream is written too fast to back up: retry, or quiesce its writers", name, attempt, torn)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("backup: stream %s: %w", name, ctx.Err())
		case <-time.After(time.Duration(attempt) * 20 * time.Millisecond):
		}
	}
	s := &Stream{Name: name, Config: meta.Config,
		FirstSeq: info.FirstSeq, LastSeq: max(info.Declared.LastSeq, info.LastSeq), Msgs: info.Messages, Bytes: info.Bytes}
	for _, f := range []string{jsm.SnapshotMetaFile, jsm.SnapshotDataFile} {
		sum, err := Checksum(filepath.Join(sdir, f))
		if err != nil {
			return nil, fmt.Errorf("backup: stream %s: %w", name, err)
		}
		sum.Name = f
		s.Files = append(s.Files, *sum)
	}
	return s, nil
}

// snapshotAttempts bounds how many times a stream is snapshotted again when its archive came out
// torn (tornSnapshot).
const snapshotAttempts = 10

// snapshotOnce writes one snapshot of st into sdir (replacing an earlier attempt's) and reads it
// back. The position is read from the archive, not from the snapshot's reply: the reply's state
// is read as the snapshot is requested, and a stream keeping one message per subject (a KV
// bucket) may replace one before the archive is cut. Reading the archive back also checks it
// decodes to its end before the backup is called done.
func snapshotOnce(ctx context.Context, st *jsm.Stream, sdir string) (*metaFile, *jsmbackup.InfoReport, error) {
	name := st.Name()
	if err := os.RemoveAll(sdir); err != nil {
		return nil, nil, fmt.Errorf("backup: stream %s: %w", name, err)
	}
	if err := snapshot(ctx, st, sdir); err != nil {
		return nil, nil, fmt.Errorf("backup: snapshot stream %s: %w", name, err)
	}
	meta, err := readMeta(filepath.Join(sdir, jsm.SnapshotMetaFile))
	if err != nil {
		return nil, nil, fmt.Errorf("backup: stream %s: %w", name, err)
	}
	info, err := jsmbackup.Info(sdir)
	if err != nil {
		return nil, nil, fmt.Errorf("backup: stream %s: the snapshot does not read back: %w", name, err)
	}
	return meta, info, nil
}

// tornSnapshot says how an archive lost messages, or "" if it holds what it declares. The
// server cuts a snapshot at a state it records in the archive (Declared) and then copies the
// stream's blocks while the stream keeps being written; a message replaced in between (a KV key
// put again: the bucket keeps one message per key) is deleted in the blocks copied, and its
// successor is past the cut, so the archive holds neither: the key is simply not in the backup.
// A view's bucket whose only entry is its checkpoint, moved at every batch, came out empty that
// way, and the restored hub rebuilt the view, dropping the bucket under the caches of the
// services that read it (TestBackupOfARunningFleetdRestoresIntoANewOne under load). Such an
// archive holds fewer messages than it declares. Streams whose messages expire (MaxAge, per
// message TTLs: the lease bucket, denied audit rows) lose some legitimately and are exempt, as
// Restore exempts their count.
func tornSnapshot(cfg api.StreamConfig, info *jsmbackup.InfoReport) string {
	if cfg.MaxAge > 0 || cfg.AllowMsgTTL || info.DeclaredCountsAdvisory {
		return ""
	}
	if info.Messages < info.Declared.Msgs {
		return fmt.Sprintf("held %d of the %d messages up to sequence %d it declares", info.Messages, info.Declared.Msgs, info.Declared.LastSeq)
	}
	return ""
}

// snapshot writes the stream's snapshot into sdir in the layout of jsm.go's
// SnapshotToDirectory (backup.json and stream.arc.s2), which its RestoreSnapshotFromDirectory
// and backup.Verify read. It goes through SnapshotToBuffer because SnapshotToDirectory always
// tracks progress by decompressing the whole archive a second time as it arrives, which this
// package does not use. Consumers are not kept: views read with ordered consumers from
// checkpoints in their buckets, and the services create their durable consumers when they
// start. The files are synced before the manifest names them.
func snapshot(ctx context.Context, st *jsm.Stream, sdir string) (err error) {
	if err := os.MkdirAll(sdir, 0o700); err != nil {
		return err
	}
	create := func(name string) (*os.File, error) {
		return os.OpenFile(filepath.Join(sdir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	}
	data, err := create(jsm.SnapshotDataFile)
	if err != nil {
		return err
	}
	meta, err := create(jsm.SnapshotMetaFile)
	if err != nil {
		_ = data.Close()
		return err
	}
	// SnapshotToBuffer closes its writers and drops the errors of Close: the files are synced
	// and closed here instead, where a failure fails the backup.
	_, err = st.SnapshotToBuffer(ctx, keepOpen{data}, keepOpen{meta})
	for _, f := range []*os.File{data, meta} {
		if serr := f.Sync(); err == nil {
			err = serr
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// keepOpen is a file whose Close does nothing.
type keepOpen struct{ *os.File }

func (keepOpen) Close() error { return nil }

// metaFile is jsm.go's backup.json: the configuration and state the snapshot response carried.
type metaFile struct {
	Config api.StreamConfig `json:"config"`
	State  api.StreamState  `json:"state"`
}

func readMeta(path string) (*metaFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m metaFile
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &m, nil
}

// Checksum reads path once and returns its size, whole digest and block digests.
func Checksum(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	whole := sha256.New()
	out := &File{}
	buf := make([]byte, BlockSize)
	for {
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			whole.Write(buf[:n])
			b := sha256.Sum256(buf[:n])
			out.Blocks = append(out.Blocks, hex.EncodeToString(b[:]))
			out.Size += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
	}
	out.SHA256 = hex.EncodeToString(whole.Sum(nil))
	return out, nil
}

// emptyDir makes dir if it does not exist and refuses one that holds anything: a backup never
// mixes with another's files.
func emptyDir(dir string) error {
	if dir == "" {
		return errors.New("backup: no directory given")
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.MkdirAll(dir, 0o700)
	case err != nil:
		return fmt.Errorf("backup: %w", err)
	case len(entries) > 0:
		return fmt.Errorf("backup: %s is not empty: a backup goes into a new or empty directory", dir)
	}
	return nil
}

func writeFileSync(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, bytes.NewReader(data)); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
