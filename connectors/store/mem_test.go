package store_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
)

func TestMemObjects(t *testing.T) {
	storetest.RunObjects(t, store.NewMemObjects())
}

func TestOverlayObjects(t *testing.T) {
	o, err := store.NewOverlay(context.Background(), store.NewMemObjects())
	if err != nil {
		t.Fatal(err)
	}
	storetest.RunObjects(t, o)
}

// An overlay sees base and what was written through it; base is never
// written.
func TestOverlayLeavesBase(t *testing.T) {
	ctx := context.Background()
	base := store.NewMemObjects()
	for _, n := range []string{"00001.json", "00002.json"} {
		if err := base.Create(ctx, n, []byte(n)); err != nil {
			t.Fatal(err)
		}
	}
	o, err := store.NewOverlay(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	// What others add to base later is not seen: it would fork the log.
	if err := base.Create(ctx, "00004.json", []byte("theirs")); err != nil {
		t.Fatal(err)
	}
	if err := o.Create(ctx, "00002.json", []byte("x")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Create over base's object: %v", err)
	}
	if err := o.Create(ctx, "00003.json", []byte("mine")); err != nil {
		t.Fatal(err)
	}
	if err := o.Create(ctx, "00004.json", []byte("mine")); err != nil {
		t.Fatal(err)
	}
	if err := o.Delete(ctx, "00001.json"); err != nil {
		t.Fatal(err)
	}
	if got, err := o.Get(ctx, "00004.json"); err != nil || string(got) != "mine" {
		t.Errorf("Get of the overlay's own record: %q %v", got, err)
	}
	if names, _ := o.List(ctx, "0"); strings.Join(names, ",") != "00002.json,00003.json,00004.json" {
		t.Errorf("overlay List: %v", names)
	}
	if _, err := o.Get(ctx, "00001.json"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Get of a deleted object: %v", err)
	}
	if got, err := o.Get(ctx, "00002.json"); err != nil || string(got) != "00002.json" {
		t.Errorf("Get of base's object: %q %v", got, err)
	}
	if names, _ := base.List(ctx, ""); strings.Join(names, ",") != "00001.json,00002.json,00004.json" {
		t.Errorf("base changed: %v", names)
	}
}
