package main

import (
	"context"

	"github.com/spf13/cobra"
)

// newSQLCmd is being written (issue 6): DuckDB views and reports.
func newSQLCmd(soft context.Context) *cobra.Command {
	return &cobra.Command{Use: "sql", Short: "DuckDB over committed shards", Hidden: true, Args: cobra.ArbitraryArgs,
		RunE: func(*cobra.Command, []string) error { return usageErrorf("sql: not built yet") }}
}
