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

	"github.com/Masterminds/semver/v3"
	"github.com/nats-io/jsm.go"
	jsmbackup "github.com/nats-io/jsm.go/backup"
	"github.com/nats-io/nats.go"
)

// RestoreOptions tune a restore.
type RestoreOptions struct {
	Options
	// Force replaces streams the target already holds; without it a restore onto a NATS
	// holding any of the backup's streams is refused before anything is written.
	Force bool
	// Replicas, when > 0, restores every stream with that many replicas instead of the
	// backed-up number (a single fleetd's backup onto a three-node cluster: 3).
	Replicas int
}

// ErrExists is returned (wrapped, naming the streams) when the target holds streams of the
// backup and Force is not set.
var ErrExists = errors.New("the target NATS already holds streams of the backup")

// ErrNewer is returned (wrapped) for a backup written by a newer format or Fleetstream version.
var ErrNewer = errors.New("backup is newer than this binary")

// ErrCorrupt is returned (wrapped, naming the file and offset) for a backup whose files do not
// match its manifest or do not decode.
var ErrCorrupt = errors.New("backup is damaged")

// Verify checks the backup in dir without a server: the manifest, then every file's size and
// block checksums, then every archive decoded entry by entry to its end. It returns the
// manifest only when everything holds.
func Verify(dir string, version string) (*Manifest, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	if err := m.checkVersion(version); err != nil {
		return nil, err
	}
	for _, s := range m.Streams {
		if err := verifyStream(dir, s); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ReadManifest reads and checks dir's manifest: known fields only, a known format, stream names
// that are valid and unique, and the two files each stream must have.
func ReadManifest(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: no manifest: not a backup, or one that did not finish: %w", path, ErrCorrupt)
	}
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", path, err, ErrCorrupt)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: data after the manifest: %w", path, ErrCorrupt)
	}
	if m.Format > Format {
		return nil, fmt.Errorf("%s: format %d; this binary reads format %d and older: restore with the Fleetstream version that wrote it (%s) or newer: %w",
			path, m.Format, Format, m.FleetstreamVersion, ErrNewer)
	}
	if m.Format < 1 {
		return nil, fmt.Errorf("%s: format: %d is not a backup format: %w", path, m.Format, ErrCorrupt)
	}
	seen := map[string]bool{}
	for i, s := range m.Streams {
		field := fmt.Sprintf("%s: streams[%d]", path, i)
		if !jsm.IsValidName(s.Name) || s.Name == "." || s.Name == ".." {
			return nil, fmt.Errorf("%s.name: %q is not a stream name: %w", field, s.Name, ErrCorrupt)
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("%s.name: stream %s listed twice: %w", field, s.Name, ErrCorrupt)
		}
		seen[s.Name] = true
		if s.Config.Name != s.Name {
			return nil, fmt.Errorf("%s.config.name: %q, not the stream's name %q: %w", field, s.Config.Name, s.Name, ErrCorrupt)
		}
		names := make([]string, 0, len(s.Files))
		for _, f := range s.Files {
			names = append(names, f.Name)
		}
		slices.Sort(names)
		if want := []string{jsm.SnapshotMetaFile, jsm.SnapshotDataFile}; !slices.Equal(names, sorted(want)) {
			return nil, fmt.Errorf("%s.files: %v, want exactly %v: %w", field, names, want, ErrCorrupt)
		}
	}
	return &m, nil
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// checkVersion refuses a backup that a newer Fleetstream wrote. Versions compare only when
// both are semantic versions (release builds); a development build ("dev", a commit) relies on
// the format, which changes whenever a backup's meaning does.
func (m *Manifest) checkVersion(version string) error {
	theirs, err1 := semver.StrictNewVersion(strings.TrimPrefix(m.FleetstreamVersion, "v"))
	ours, err2 := semver.StrictNewVersion(strings.TrimPrefix(version, "v"))
	if err1 != nil || err2 != nil {
		return nil
	}
	if theirs.GreaterThan(ours) {
		return fmt.Errorf("backup written by Fleetstream %s, this is %s: events and views of a newer version may not be understood; restore with %s or newer: %w",
			m.FleetstreamVersion, version, m.FleetstreamVersion, ErrNewer)
	}
	return nil
}

// verifyStream checks one stream's files against the manifest and decodes its archive.
func verifyStream(dir string, s Stream) error {
	sdir := filepath.Join(dir, StreamsDir, s.Name)
	for _, f := range s.Files {
		if err := verifyFile(filepath.Join(sdir, f.Name), f); err != nil {
			return err
		}
	}
	meta, err := readMeta(filepath.Join(sdir, jsm.SnapshotMetaFile))
	if err != nil {
		return fmt.Errorf("%w: %w", err, ErrCorrupt)
	}
	if meta.Config.Name != s.Name {
		return fmt.Errorf("%s: config of stream %q, the manifest says %q: %w",
			filepath.Join(sdir, jsm.SnapshotMetaFile), meta.Config.Name, s.Name, ErrCorrupt)
	}
	// The archive's own structure, as the server's restore will read it: a file damaged before
	// its checksums were taken (a disk error while the backup was written) fails here.
	rep, err := jsmbackup.Verify(sdir)
	if err != nil {
		return fmt.Errorf("%w: %w", err, ErrCorrupt)
	}
	if rep.Messages != s.Msgs || rep.LastSeq > s.LastSeq {
		return fmt.Errorf("%s: %d messages up to sequence %d, the manifest says %d up to %d: %w",
			filepath.Join(sdir, jsm.SnapshotDataFile), rep.Messages, rep.LastSeq, s.Msgs, s.LastSeq, ErrCorrupt)
	}
	return nil
}

// verifyFile compares a file with its manifest entry, naming the offset where they part.
func verifyFile(path string, want File) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %w", err, ErrCorrupt)
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() < want.Size {
		return fmt.Errorf("%s: truncated at offset %d: the manifest says %d bytes: %w", path, st.Size(), want.Size, ErrCorrupt)
	}
	if st.Size() > want.Size {
		return fmt.Errorf("%s: %d bytes past offset %d, where the manifest says it ends: %w", path, st.Size()-want.Size, want.Size, ErrCorrupt)
	}
	if want.Size > 0 && int64(len(want.Blocks)) != (want.Size+BlockSize-1)/BlockSize {
		return fmt.Errorf("%s: the manifest has %d block checksums for %d bytes: %w", path, len(want.Blocks), want.Size, ErrCorrupt)
	}
	whole := sha256.New()
	buf := make([]byte, BlockSize)
	for i := 0; ; i++ {
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			whole.Write(buf[:n])
			b := sha256.Sum256(buf[:n])
			if i >= len(want.Blocks) || hex.EncodeToString(b[:]) != want.Blocks[i] {
				return fmt.Errorf("%s: checksum mismatch in bytes %d to %d (block %d of %d bytes): %w",
					path, int64(i)*BlockSize, int64(i)*BlockSize+int64(n)-1, i, BlockSize, ErrCorrupt)
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
	}
	if got := hex.EncodeToString(whole.Sum(nil)); got != want.SHA256 {
		return fmt.Errorf("%s: checksum mismatch: sha256 %s, the manifest says %s: %w", path, got, want.SHA256, ErrCorrupt)
	}
	return nil
}

// Restore restores the backup in dir onto the NATS nc is connected to. It verifies the whole
// backup first (Verify) and checks that the target holds none of its streams (unless
// opts.Force): a damaged backup, a newer one, or an occupied target restores nothing. Streams are
// restored in the backup's order; if the server fails one, the streams this call created are
// deleted again, so a failed restore leaves the target as it found it (with Force, the replaced
// streams stay deleted: restore again). Each restored stream is checked to hold the
// manifest's position and message count.
func Restore(ctx context.Context, nc *nats.Conn, dir string, opts RestoreOptions) (*Manifest, error) {
	m, err := Verify(dir, opts.Version)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	mgr, err := opts.manager(nc)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	var existing []string
	for _, s := range m.Streams {
		ok, err := mgr.IsKnownStream(s.Name)
		if err != nil {
			return nil, fmt.Errorf("restore: look up stream %s: %w", s.Name, err)
		}
		if ok {
			existing = append(existing, s.Name)
		}
	}
	if len(existing) > 0 && !opts.Force {
		return nil, fmt.Errorf("restore: %w: %s; restore onto an empty NATS, or replace them with --force", ErrExists, strings.Join(existing, ", "))
	}
	var created []string
	undo := func(err error) (*Manifest, error) {
		var errs []error
		for _, name := range created {
			if st, lerr := mgr.LoadStream(name); lerr == nil {
				if derr := st.Delete(); derr != nil {
					errs = append(errs, fmt.Errorf("delete restored stream %s: %w", name, derr))
				}
			}
		}
		return nil, errors.Join(append([]error{fmt.Errorf("restore: %w (the streams this restore created were deleted)", err)}, errs...)...)
	}
	for _, s := range m.Streams {
		if slices.Contains(existing, s.Name) {
			st, err := mgr.LoadStream(s.Name)
			if err != nil {
				return undo(fmt.Errorf("stream %s: %w", s.Name, err))
			}
			if err := st.Delete(); err != nil {
				return undo(fmt.Errorf("replace stream %s: %w", s.Name, err))
			}
		}
		cfg := s.Config
		if opts.Replicas > 0 {
			cfg.Replicas = opts.Replicas
		}
		start := time.Now()
		_, state, err := mgr.RestoreSnapshotFromDirectory(ctx, s.Name, filepath.Join(dir, StreamsDir, s.Name), jsm.RestoreConfiguration(cfg))
		if err != nil {
			return undo(fmt.Errorf("stream %s: %w", s.Name, err))
		}
		created = append(created, s.Name)
		// Messages past a stream's age limit or their own TTL may expire as the stream is
		// restored (the lease bucket's, denied audit rows): their count may drop, the
		// position may not.
		expires := s.Config.MaxAge > 0 || s.Config.AllowMsgTTL
		if state.LastSeq != s.LastSeq || (state.Msgs != s.Msgs && !expires) {
			return undo(fmt.Errorf("stream %s restored with %d messages up to sequence %d, the backup holds %d up to %d",
				s.Name, state.Msgs, state.LastSeq, s.Msgs, s.LastSeq))
		}
		if opts.Progress != nil {
			opts.Progress(s, time.Since(start))
		}
	}
	return m, nil
}
