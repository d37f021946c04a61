package kafka

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newTopic creates a fresh topic of parts partitions, named after prefix,
// on the test broker (RLLM_PIPE_KAFKA_BROKERS; without one the test is
// skipped).
func newTopic(ctx context.Context, t *testing.T, prefix string, parts int) Config {
	t.Helper()
	brokers := os.Getenv("RLLM_PIPE_KAFKA_BROKERS")
	if brokers == "" {
		t.Skip("RLLM_PIPE_KAFKA_BROKERS not set: run `make test` (it starts Kafka)")
	}
	cfg := Config{Brokers: strings.Split(brokers, ","), Topic: fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())}
	if err := EnsureTopic(ctx, cfg, parts, 1); err != nil {
		t.Fatal(err)
	}
	return cfg
}
