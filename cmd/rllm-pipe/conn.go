package main

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
)

// connFlags are the connection settings that may come from flags; secrets
// come only from the environment (a flag would show in the process list).
type connFlags struct {
	kafkaTLS  bool
	kafkaSASL string
	kafkaUser string
	s3Region  string
	s3Endpt   string
	retryFor  time.Duration
}

func (c *connFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&c.kafkaTLS, "kafka-tls", false, "connect to Kafka over TLS")
	f.StringVar(&c.kafkaSASL, "kafka-sasl-mechanism", "", "Kafka SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (password from RLLM_KAFKA_SASL_PASSWORD)")
	f.StringVar(&c.kafkaUser, "kafka-sasl-username", "", "Kafka SASL user name")
	f.StringVar(&c.s3Endpt, "s3-endpoint", "", "S3 endpoint URL (default AWS_ENDPOINT_URL; keys from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
	f.StringVar(&c.s3Region, "s3-region", "", "S3 region (default AWS_REGION, else us-east-1)")
	f.DurationVar(&c.retryFor, "retry-for", s3.DefaultRetryFor, "how long an unreachable S3 or Kafka is retried before the command fails (a first signal stops retrying at once)")
}

// check validates the settings.
func (c *connFlags) check() error {
	if c.retryFor <= 0 {
		return usageErrorf("--retry-for: must be positive, not %s", c.retryFor)
	}
	return nil
}

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

func (c *connFlags) options() connectors.Options {
	return connectors.Options{S3Endpoint: c.s3Endpt, S3Region: c.s3Region, RetryFor: c.retryFor}
}
