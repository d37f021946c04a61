//go:build noiceberg

package main

import (
	"context"
	"errors"

	"github.com/spf13/cobra"
)

// newIcebergCmd, in a build without Iceberg, says so.
func newIcebergCmd(context.Context) *cobra.Command {
	return &cobra.Command{
		Use:    "iceberg",
		Short:  "Not in this build (built with -tags noiceberg)",
		Hidden: true,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("this rllm-pipe was built without Iceberg (-tags noiceberg)")
		},
	}
}
