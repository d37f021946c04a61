//go:build !(linux || darwin || freebsd)

package ingest

import (
	"errors"
	"os"
)

func mapFile(*os.File, int64) ([]byte, error) { return nil, errors.ErrUnsupported }
func dropPages([]byte)                        {}
func willNeed([]byte)                         {}
func unmapFile([]byte) error                  { return nil }

func osPageSize() int { return 4096 }
