package collector

import (
	"bytes"
	"compress/gzip"
	"hash/maphash"
	"io"
	"sync"
)

// The gzip of a cached response, made once like its encoding. Connect compresses a unary
// response after the codec has encoded it (when the client asked with Accept-Encoding and the
// message is past the server's minimum), through the Compressor registered for the name: the
// one below, which is given the encoded bytes and nothing else. So the cache indexes each
// encoding it holds by a hash of its bytes, and the compressor answers bytes found there with
// their cached gzip; any other message is compressed as Connect's own gzip compressor does.
// Entries whose encodings are the same bytes (READY and READY_OR_TERMINATING of a service with a
// ready endpoint) share one gzipped: it is dropped from the index with the last of them.

// Encodings of a cached response, indexes of cachedResponse.gz.
const (
	encJSON = iota
	encBinary
)

// gzippedOverhead is what a gzipped, its list of holders and its index node (with its boxed
// key) cost, charged to every entry holding it: ~230 bytes with thousands of them
// (TestCachedBytesMatchHeap).
const gzippedOverhead = 232

type gzipped struct {
	raw  []byte // the encoding, shared with the entries holding this (never written)
	hash uint64

	once sync.Once
	gz   []byte

	// Under responseCodec.mu.
	refs   []*cachedResponse // the entries holding it
	gzSize int64             // cap(gz), once made and charged to refs
}

// refGzippedLocked indexes encoding enc (hash h) of c: a new gzipped, or the one already
// indexed with the same bytes. It returns nil on a hash collision with other bytes (not
// indexed: compressed per request, as without a cache).
func (r *responseCodec) refGzippedLocked(c *cachedResponse, h uint64, enc []byte) *gzipped {
	if v, ok := r.gz.Load(h); ok {
		g := v.(*gzipped)
		if !bytes.Equal(g.raw, enc) {
			return nil
		}
		g.refs = append(g.refs, c)
		r.chargeLocked(c, gzippedOverhead+g.gzSize)
		return g
	}
	g := &gzipped{raw: enc, hash: h, refs: []*cachedResponse{c}}
	r.gz.Store(h, g)
	r.chargeLocked(c, gzippedOverhead)
	return g
}

// unrefGzippedLocked drops c from g's holders (c's bytes are already uncounted), and g from the
// index with the last of them.
func (r *responseCodec) unrefGzippedLocked(c *cachedResponse, g *gzipped) {
	for i, o := range g.refs {
		if o == c {
			last := len(g.refs) - 1
			g.refs[i] = g.refs[last]
			g.refs[last] = nil
			g.refs = g.refs[:last]
			break
		}
	}
	if len(g.refs) == 0 {
		r.gz.CompareAndDelete(g.hash, g)
	}
}

// lookupGzipped returns the indexed gzipped of encoding p, or nil.
func (r *responseCodec) lookupGzipped(p []byte) *gzipped {
	if r == nil || len(p) == 0 {
		return nil
	}
	v, ok := r.gz.Load(maphash.Bytes(r.seed, p))
	if !ok {
		return nil
	}
	if g := v.(*gzipped); bytes.Equal(g.raw, p) {
		return g
	}
	return nil
}

// gzipWriter is a writer that makes cached gzip encodings and the buffer it writes to. The
// writer stays pointed at its own buffer between uses: a flate writer's Reset clears ~600 KB of
// tables, which for a response of a few KB costs more than compressing it, so it is reset once
// per encoding, not again to let go of the buffer.
type gzipWriter struct {
	buf bytes.Buffer
	zw  *gzip.Writer
}

// gzipWriters holds the writers that make cached gzip encodings (a flate writer allocates
// ~600 KB of tables: made once, not per encoding).
var gzipWriters = sync.Pool{New: func() any {
	w := &gzipWriter{}
	w.zw = gzip.NewWriter(&w.buf)
	return w
}}

// maxPooledGzipBuf bounds the buffer a pooled writer keeps (a rare large response's is dropped).
const maxPooledGzipBuf = 64 << 10

// bytes returns the gzip of g.raw, made on first use (at the default level, as Connect's gzip)
// and charged to the entries holding g.
func (g *gzipped) bytes(r *responseCodec) []byte {
	g.once.Do(func() {
		w := gzipWriters.Get().(*gzipWriter)
		w.buf.Reset()
		w.zw.Reset(&w.buf)
		_, _ = w.zw.Write(g.raw) // a bytes.Buffer does not fail
		_ = w.zw.Close()
		g.gz = bytes.Clone(w.buf.Bytes())
		if w.buf.Cap() <= maxPooledGzipBuf {
			gzipWriters.Put(w)
		}
		r.gzipsCached.Add(1)

		r.mu.Lock()
		defer r.mu.Unlock()
		g.gzSize = int64(cap(g.gz))
		for _, c := range g.refs {
			r.chargeLocked(c, g.gzSize)
		}
		r.evictLocked()
	})
	return g.gz
}

// gzipCompressor is the handlers' gzip Compressor (see the top of this file). Connect writes a
// message with one Write: if those bytes are a cached encoding, nothing is compressed and Close
// writes the cached gzip.
type gzipCompressor struct {
	r   *responseCodec
	dst io.Writer

	wrote bool
	hit   *gzipped     // the first Write was a cached encoding; nothing written to dst yet
	zw    *gzip.Writer // compressing into dst when on
	on    bool
}

func (z *gzipCompressor) Reset(w io.Writer) {
	z.dst, z.wrote, z.hit, z.on = w, false, nil, false
}

func (z *gzipCompressor) Write(p []byte) (int, error) {
	if !z.wrote {
		z.wrote = true
		if g := z.r.lookupGzipped(p); g != nil {
			z.hit = g
			return len(p), nil
		}
	}
	if g := z.hit; g != nil { // written in more than one piece after all: compress it all
		z.hit = nil
		z.start()
		if _, err := z.zw.Write(g.raw); err != nil {
			return 0, err
		}
	}
	if !z.on {
		z.start()
	}
	return z.zw.Write(p)
}

func (z *gzipCompressor) start() {
	if z.r != nil {
		z.r.gzipsPerRequest.Add(1)
	}
	if z.zw == nil {
		z.zw = gzip.NewWriter(z.dst)
	} else {
		z.zw.Reset(z.dst)
	}
	z.on = true
}

func (z *gzipCompressor) Close() error {
	if g := z.hit; g != nil {
		z.hit = nil
		_, err := z.dst.Write(g.bytes(z.r))
		return err
	}
	if !z.on {
		z.start() // nothing written: an empty gzip stream, as gzip.Writer's
	}
	z.on = false
	return z.zw.Close()
}
