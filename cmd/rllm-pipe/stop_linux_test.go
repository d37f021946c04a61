package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"
)

// TestStopStdinReadsWhatThePipeHolds: a producer goes on writing into
// ingest's stdin while ingest gets SIGTERM with the pipe holding records.
// The records written are a prefix of those sent, each once (or
// dead-lettered), that holds every record whose write returned before the
// signal: the stop reads what the pipe holds, then gives the pipe up, so
// the producer's later writes fail (EPIPE). Writes that land in the
// instant between the last read and the release cannot be refused by a
// pipe: the pipe is shrunk to a page first, so they are at most 4 KiB
// (the 32 records the pipe held were lost without the drain, and up to
// 53,200 bytes of writes after it without the shrink).
func TestStopStdinReadsWhatThePipeHolds(t *testing.T) {
	bin := e2eBinary(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	var records [][]byte
	pad := strings.Repeat("x", 1500) // slow to decode: the pipe fills
	for _, r := range stopRecords(1500) {
		records = append(records, append(bytes.TrimSuffix(r, []byte("}")), []byte(`,"metadata":{"pad":"`+pad+`"}}`)...))
	}
	for attempt := 0; ; attempt++ {
		os.RemoveAll(out)
		cmd := exec.Command(bin, "ingest", "--from", "-", "--to", out, "--group-size", "4", "--min-group-size", "2",
			"--flush-interval", "1h", "--decoders", "1", "--encoders", "1", "--spill", filepath.Join(dir, "spill.jsonl"))
		cmd.Env = e2eEnv()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdin = r
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		signal.Ignore(syscall.SIGPIPE)
		written := make(chan int, 1)
		sent := make(chan struct{})
		var returned atomic.Int64 // writes that returned so far
		var half sync.Once
		go func() {
			defer half.Do(func() { close(sent) }) // an ingest that failed early
			n := 0
			for i, rec := range records {
				if i == len(records)/2 {
					half.Do(func() { close(sent) })
				}
				if _, err := w.Write(append(rec, '\n')); err != nil {
					break
				}
				n++
				returned.Add(1)
			}
			written <- n
		}()
		<-sent
		var held int32
		syscall.Syscall(syscall.SYS_IOCTL, w.Fd(), syscall.TIOCINQ, uintptr(unsafe.Pointer(&held)))
		before := int(returned.Load())
		err = terminate(t, cmd, waitChan(cmd), &stderr)
		w.Close()
		nw := <-written
		records := records[:nw]
		t.Logf("%d records written by the producer", nw)
		if err != nil {
			t.Fatalf("ingest: %v\n%s", err, e2eClip(stderr.String(), 2000))
		}
		if held == 0 {
			if attempt < 3 {
				continue // ingest kept up: nothing was in the pipe
			}
			t.Skip("the pipe was empty at the signal every time")
		}
		t.Logf("%d bytes in the pipe at the signal", held)
		steps, trajs, letters := outputAccount(t, out)
		lettered := map[string]int{}
		for _, dl := range letters {
			lettered[dl.Record]++
		}
		prefix, lostBytes := 0, 0 // records written once from the first; bytes of the rest
		for i, rec := range records {
			var raw map[string]any
			_ = json.Unmarshal(rec, &raw)
			n := lettered[string(rec)]
			if raw["type"] == "step" {
				n += steps[raw["step_id"].(string)]
			} else {
				n += trajs[raw["trajectory_id"].(string)]
			}
			switch {
			case n == 1 && prefix == i:
				prefix++
			case n != 0 || prefix != i && i < before:
				t.Fatalf("record %d of %d written %d times after a gap at %d (%d returned before the signal, %d bytes in the pipe then)\n%s",
					i, len(records), n, prefix, before, held, e2eClip(stderr.String(), 1500))
			default:
				lostBytes += len(rec) + 1
			}
		}
		if prefix < before {
			t.Fatalf("the first %d records were written, but %d writes had returned before the signal (%d bytes in the pipe then)\n%s",
				prefix, before, held, e2eClip(stderr.String(), 1500))
		}
		if page := os.Getpagesize(); lostBytes > page {
			t.Fatalf("%d records (%d bytes) written after the signal were lost: more than the page the pipe shrinks to before it is given up", len(records)-prefix, lostBytes)
		}
		t.Logf("%d records written, %d returned before the signal; %d later ones (%d bytes) lost in the pipe's last page", prefix, before, len(records)-prefix, lostBytes)
		return
	}
}
