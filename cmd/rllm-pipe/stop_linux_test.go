package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// TestStopStdinReadsWhatThePipeHolds: a producer goes on writing into
// ingest's stdin while ingest gets SIGTERM with the pipe holding records.
// Every record whose write returned is written (or dead-lettered) once:
// the stop reads what the pipe holds, then gives the pipe up, so the
// producer's later writes fail (EPIPE) instead of vanishing (32 of 10,457
// were lost before).
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
		go func() {
			n := 0
			for i, rec := range records {
				if i == len(records)/2 {
					close(sent)
				}
				if _, err := w.Write(append(rec, '\n')); err != nil {
					break
				}
				n++
			}
			written <- n
		}()
		<-sent
		var held int32
		syscall.Syscall(syscall.SYS_IOCTL, w.Fd(), syscall.TIOCINQ, uintptr(unsafe.Pointer(&held)))
		cmd.Process.Signal(syscall.SIGTERM)
		err = cmd.Wait()
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
		missing := 0
		for _, rec := range records {
			var raw map[string]any
			_ = json.Unmarshal(rec, &raw)
			n := lettered[string(rec)]
			if raw["type"] == "step" {
				n += steps[raw["step_id"].(string)]
			} else {
				n += trajs[raw["trajectory_id"].(string)]
			}
			if n != 1 {
				missing++
			}
		}
		if missing > 0 {
			t.Fatalf("%d of %d records whose write returned were not written once (%d bytes were in the pipe at the signal)\n%s", missing, len(records), held, e2eClip(stderr.String(), 1500))
		}
		return
	}
}
