package recordlog

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
)

// HeaderSize is the size of the whitespace header every log file starts
// with: the span `ingest --from` fingerprints.
const HeaderSize = 64 << 10

// nonceBits is the nonce's length, one space or tab per bit on the
// header's first line.
const nonceBits = 128

// HeaderLines is how many (blank) lines the header is; a file's first
// record is line HeaderLines+1.
var HeaderLines = int64(bytes.Count(header(make([]byte, nonceBits/8)), []byte{'\n'}))

// header returns the header holding nonce: a line of spaces and tabs
// (one per bit), then lines of spaces up to HeaderSize bytes, the last
// byte a newline.
func header(nonce []byte) []byte {
	h := make([]byte, 0, HeaderSize)
	for i := range nonceBits {
		if nonce[i/8]>>(i%8)&1 == 1 {
			h = append(h, '\t')
		} else {
			h = append(h, ' ')
		}
	}
	h = append(h, '\n')
	for len(h) < HeaderSize {
		n := min(1024, HeaderSize-len(h))
		h = append(h, bytes.Repeat([]byte{' '}, n-1)...)
		h = append(h, '\n')
	}
	return h
}

// newHeader returns a header with a fresh random nonce.
func newHeader() []byte {
	nonce := make([]byte, nonceBits/8)
	_, _ = rand.Read(nonce)
	return header(nonce)
}

// errNotLog marks a file that does not start with a log header.
var errNotLog = errors.New("not a record log (no header: a file the gateway did not create)")

// readHeader reads f's header and returns the stream identity its nonce
// makes.
func readHeader(f *os.File) (string, error) {
	h := make([]byte, HeaderSize)
	if _, err := f.ReadAt(h, 0); err != nil {
		if errors.Is(err, io.EOF) {
			return "", errNotLog
		}
		return "", fmt.Errorf("read header: %w", err)
	}
	nonce := make([]byte, nonceBits/8)
	for i, c := range h[:nonceBits] {
		switch c {
		case '\t':
			nonce[i/8] |= 1 << (i % 8)
		case ' ':
		default:
			return "", errNotLog
		}
	}
	if !bytes.Equal(h, header(nonce)) {
		return "", errNotLog
	}
	return "recordlog/" + hex.EncodeToString(nonce), nil
}
