package main

import "github.com/spf13/cobra"

// examples are each command's examples in its help ("Examples:"), by
// command path below the root; a command that sets its own keeps it.
// TestEveryCommandHasExamples parses each against the command's flags.
var examples = map[string]string{
	"gen": `  # 2,000 groups of 8 trajectories as wire-format JSON lines
  rllm-pipe gen --groups 2000 --group-size 8 --to traces.jsonl

  # multi-turn agents with tool observations, 1 to 4 turns
  rllm-pipe gen --groups 100 --turns 1..4 --to multiturn.jsonl`,
	"ingest": `  # local files in, shards out (the embedded default)
  rllm-pipe ingest --from traces.jsonl --to data --group-size 8

  # Kafka in, MinIO out, exactly once; dead letters in the store
  rllm-pipe ingest --from kafka://127.0.0.1:9092/steps --to s3://runs/exp1 --flush-interval 5s

  # records from stdin, GRPO with verl's conventions
  cat traces.jsonl | rllm-pipe ingest --from - --to data --estimator grpo --compat verl`,
	"summary": `  rllm-pipe summary --from data`,
	"produce": `  # send a file of records to a topic (created with 8 partitions if missing)
  rllm-pipe produce --to kafka://127.0.0.1:9092/steps traces.jsonl`,
	"serve": `  # trainers connect over Arrow Flight (Python: rllm_pipe.Client)
  rllm-pipe serve --from data --max-tokens 32000

  # follow a run, skip groups more than 2 versions stale
  rllm-pipe serve --from s3://runs/exp1 --follow --max-staleness 2 --ready-file serve.addr`,
	"export": `  rllm-pipe export sft --from data --to sft.jsonl --best-of-n 2 --min-reward 1
  rllm-pipe export distill --from data --to distill.parquet`,
	"export sft": `  # the 2 best trajectories of each task with reward >= 1, as chat messages
  rllm-pipe export sft --from data --to sft.jsonl --best-of-n 2 --min-reward 1

  # prompt-completion rows in Parquet, with ids and rewards
  rllm-pipe export sft --from data --to sft.parquet --format prompt-completion --with-ids`,
	"sql": `  # the views and their columns
  rllm-pipe sql --from data

  # a named report
  rllm-pipe sql --from data --report reward-by-version

  # any query, as CSV
  rllm-pipe sql --from data --format csv "SELECT policy_version, count(*) FROM steps GROUP BY 1"`,
	"import": `  rllm-pipe import rllm --from ~/.rllm/gateway_traces.db --rewards rewards.jsonl --to r.jsonl`,
	"import rllm": `  # the model gateway's trace store, with rewards by session, into ingest
  rllm-pipe import rllm --from ~/.rllm/gateway_traces.db --rewards rewards.jsonl --to - |
    rllm-pipe ingest --from - --to data

  # an rllm eval run directory, to a file
  rllm-pipe import rllm --from runs/eval-1 --to eval.jsonl --dlq eval.dlq.jsonl`,
	"gateway": `  # agents use http://127.0.0.1:8816/sessions/<id>/v1 as their OpenAI base URL
  rllm-pipe gateway --upstream http://127.0.0.1:8000 --to data

  # records to Kafka, for ingest workers elsewhere
  rllm-pipe gateway --upstream http://10.0.0.5:8000,http://10.0.0.6:8000 \
    --to kafka://127.0.0.1:9092/steps --trainer-store s3://runs/exp1`,
	"report": `  rllm-pipe report --from data --to report.html`,
	"replay": `  # a group "again" that receives exactly the batches "default" acknowledged
  rllm-pipe replay --from data --consumer-group default --to again`,
	"compact": `  rllm-pipe compact --from data

  # beside a running ingest, every 5 minutes
  rllm-pipe compact --from s3://runs/exp1 --every 5m`,
	"publish-version": `  # the trainer's new weights are served: stamp calls with version 7
  rllm-pipe publish-version --from data --policy-version 7

  rllm-pipe publish-version --from data --show`,
}

// addExamples sets the examples of the commands under root.
func addExamples(root *cobra.Command) {
	var walk func(c *cobra.Command, path string)
	walk = func(c *cobra.Command, path string) {
		if ex, ok := examples[path]; ok && c.Example == "" {
			c.Example = ex
		}
		for _, sub := range c.Commands() {
			p := sub.Name()
			if path != "" {
				p = path + " " + p
			}
			walk(sub, p)
		}
	}
	walk(root, "")
}
