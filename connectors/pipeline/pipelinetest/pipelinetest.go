// Package pipelinetest holds what tests that run a pipeline share: a
// small configuration and groups of records.
package pipelinetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline"
)

// Config is a pipeline configuration for tests: GRPO (rLLM), groups of 2,
// 1 MiB shards committed every 20 ms.
func Config(t testing.TB) pipeline.Config {
	t.Helper()
	est, err := advantage.New("grpo", advantage.Options{Compat: advantage.RLLM})
	if err != nil {
		t.Fatal(err)
	}
	return pipeline.Config{
		GroupSize: 2, MinGroupSize: 2, MaxOpenGroups: 1 << 10,
		Estimator: est, Label: "grpo/rllm",
		ShardSize: 1 << 20, FlushInterval: 20 * time.Millisecond,
		Decoders: 2, Encoders: 1,
	}
}

// GroupLines returns the records of group g: two one-step trajectories
// (step ids g<g>-t0, g<g>-t1), at policy version g%3.
func GroupLines(g int) []string {
	var out []string
	for tr := range 2 {
		out = append(out,
			fmt.Sprintf(`{"type":"step","step_id":"g%d-t%d","task_id":"g%d","trajectory_id":"g%d-t%d","step_index":0,"policy_version":%d,"prompt_ids":[1,2,3],"response_ids":[4],"response_logprobs":[-1],"finish_reason":"stop"}`, g, tr, g, g, tr, g%3),
			fmt.Sprintf(`{"type":"trajectory","trajectory_id":"g%d-t%d","task_id":"g%d","reward":%d,"num_steps":1}`, g, tr, g, tr))
	}
	return out
}
