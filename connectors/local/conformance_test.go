package local_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Backend{
		NewRoot: func(t *testing.T) string { return t.TempDir() },
		Open: func(t *testing.T, root, writer string) (store.Store, error) {
			return local.Open(root, writer)
		},
		OpenReader: func(t *testing.T, root string) (store.Reader, error) {
			return local.OpenReader(root)
		},
		Put: func(t *testing.T, root, rel string, data []byte) {
			p := filepath.Join(root, filepath.FromSlash(rel))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
		},
		Exists: func(t *testing.T, root, rel string) bool {
			_, err := os.Lstat(filepath.Join(root, filepath.FromSlash(rel)))
			return err == nil
		},
		Crash: func(t *testing.T, st store.Store) { local.Crash(st.(*local.Store)) },
	})
}
