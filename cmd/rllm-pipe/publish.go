package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train"
	"github.com/rllm-pipe/rllm-pipe/train/loop"
)

func newPublishVersionCmd(soft context.Context) *cobra.Command {
	var (
		from, group, by string
		version         int64
		show            bool
		conn            connFlags
	)
	cmd := &cobra.Command{
		Use:   "publish-version --from URL --policy-version N",
		Short: "Say which policy version the inference workers serve (the gateway follows)",
		Long: `publish-version records, in the store at --from, that the inference
workers now serve --policy-version for --consumer-group (what the Python
client's publish_version and serve's publish_policy_version action do). A
gateway that follows the store stamps new calls with it within its
--trainer-poll. The highest version published counts: publishing one
already published, or a lower one, changes nothing. --show prints the
served version instead (JSON; policy_version -1 when none).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from == "" {
				return usageErrorf("--from is required")
			}
			if err := firstErr(train.CheckName("--consumer-group", group), train.CheckName("--by", by)); err != nil {
				return usageErrorf("%v", err)
			}
			if !show {
				if err := int64In("policy-version", version, 0, schemas.MaxPolicyVersion); err != nil {
					return err
				}
			}
			r, err := openShardStore(store.WithRetryStop(cmd.Context(), soft.Done()), from, conn)
			if err != nil {
				return err
			}
			defer r.Close()
			p, err := loop.NewPublisher(r, group)
			if err != nil {
				return err
			}
			var out loop.Publication
			if show {
				served, ok, err := loop.Served(cmd.Context(), p.Obj)
				if err != nil {
					return err
				}
				if out = served; !ok {
					out.PolicyVersion = -1
				}
			} else if out, err = loop.Publish(cmd.Context(), p.Obj, version, by); err != nil {
				return err
			}
			b, _ := json.Marshal(out)
			_, err = fmt.Fprintln(cmd.OutOrStdout(), string(b))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from", "", "the shard root the trainer consumes (a path or s3://bucket/prefix)")
	f.StringVar(&group, "consumer-group", "default", "the trainer's consumer group")
	f.Int64Var(&version, "policy-version", -1, "the policy version the inference workers now serve")
	f.StringVar(&by, "by", "cli", "who publishes (recorded with the version)")
	f.BoolVar(&show, "show", false, "print the served version instead of publishing")
	conn.register(f)
	return cmd
}
