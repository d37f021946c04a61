//go:build !linux

package ingest

import "errors"

func populate([]byte) error { return errors.ErrUnsupported }
