package ingest

import "context"

var t0 = context.Background()
