package store_test

import (
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
)

func TestMemObjects(t *testing.T) {
	storetest.RunObjects(t, store.NewMemObjects())
}
