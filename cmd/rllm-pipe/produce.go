package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
)

func newProduceCmd() *cobra.Command {
	var (
		to         string
		batch      int
		partitions int
		conn       connFlags
		quiet      bool
	)
	cmd := &cobra.Command{
		Use:   "produce --to kafka://host:port/topic [FILE|-]",
		Short: "Send wire-format records to a Kafka topic, keyed by group",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := firstErr(intIn("batch", batch, 1, 1<<20), intIn("kafka-partitions", partitions, 1, 1<<14)); err != nil {
				return err
			}
			if !strings.HasPrefix(to, "kafka://") {
				return usageErrorf("--to must be kafka://host:port/topic")
			}
			cfg, err := kafka.ParseURL(to)
			if err != nil {
				return usageErrorf("--to: %v", err)
			}
			cfg = conn.kafka(cfg)
			var in io.Reader = cmd.InOrStdin()
			if len(args) == 1 && args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return fmt.Errorf("produce: %w", err)
				}
				defer f.Close()
				in = f
			}
			if err := kafka.EnsureTopic(cmd.Context(), cfg, partitions, 1); err != nil {
				return err
			}
			p, err := kafka.NewProducer(cfg)
			if err != nil {
				return err
			}
			total := int64(-1)
			if f, ok := in.(*os.File); ok && f != os.Stdin {
				if info, err := f.Stat(); err == nil && info.Mode().IsRegular() {
					total = info.Size()
				}
			}
			var read atomic.Int64
			stop := newProgress(cmd.ErrOrStderr(), "produce", total, true, quiet).follow(read.Load)
			defer stop()
			r := bufio.NewReaderSize(in, 1<<20)
			var pending [][]byte
			var sent, bytes int64
			flush := func() error {
				if len(pending) == 0 {
					return nil
				}
				if err := p.Send(cmd.Context(), pending...); err != nil {
					return err
				}
				sent += int64(len(pending))
				pending = pending[:0]
				return nil
			}
			for {
				line, err := r.ReadBytes('\n')
				read.Add(int64(len(line)))
				if l := strings.TrimRight(string(line), "\r\n"); strings.TrimSpace(l) != "" {
					pending = append(pending, []byte(l))
					bytes += int64(len(l))
					if len(pending) >= batch {
						if ferr := flush(); ferr != nil {
							p.Close()
							return ferr
						}
					}
				}
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					p.Close()
					return fmt.Errorf("produce: read: %w", err)
				}
			}
			if err := flush(); err != nil {
				p.Close()
				return err
			}
			if err := p.Close(); err != nil {
				return fmt.Errorf("produce: %w", err)
			}
			stop()
			if !quiet {
				fmt.Fprintf(cmd.ErrOrStderr(), "produce: %d records (%.1f MiB) to %s\n", sent, float64(bytes)/(1<<20), cfg)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "kafka://host:port[,host:port]/topic")
	f.IntVar(&batch, "batch", 1000, "records per send")
	f.IntVar(&partitions, "kafka-partitions", 8, "partitions of the topic when produce creates it")
	cli.Rename(f, "partitions", "kafka-partitions")
	f.BoolVar(&quiet, "quiet", false, "no summary on stderr")
	conn.registerKafka(f)
	conn.RegisterRetry(f)
	return cmd
}
