package main

import (
	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
)

// connFlags are the connection settings that may come from flags; secrets
// come only from the environment (a flag would show in the process list).
type connFlags struct {
	kafkaTLS  bool
	kafkaSASL string
	kafkaUser string
	cli.S3Flags
}

// register adds the store's flags (S3 and --retry-for): every command
// that reads or writes a shard root takes them.
func (c *connFlags) register(f *pflag.FlagSet) { c.S3Flags.Register(f) }

// registerKafka adds Kafka's TLS and SASL flags: only the commands that
// reach Kafka (ingest, gateway, produce) take them.
func (c *connFlags) registerKafka(f *pflag.FlagSet) {
	f.BoolVar(&c.kafkaTLS, "kafka-tls", false, "connect to Kafka over TLS")
	f.StringVar(&c.kafkaSASL, "kafka-sasl-mechanism", "", "Kafka SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (password from RLLM_PIPE_KAFKA_SASL_PASSWORD)")
	f.StringVar(&c.kafkaUser, "kafka-sasl-username", "", "Kafka SASL user name")
}

// check validates the settings.
func (c *connFlags) check() error { return c.Check() }

func (c *connFlags) kafka(cfg kafka.Config) kafka.Config {
	if c.kafkaTLS {
		cfg.TLS = true
	}
	if c.kafkaSASL != "" {
		cfg.SASL = c.kafkaSASL
	}
	if c.kafkaUser != "" {
		cfg.User = c.kafkaUser
	}
	return cfg
}

func (c *connFlags) options() connectors.Options { return c.Options() }
