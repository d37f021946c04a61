package store

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync"
)

// MemObjects is an Objects in memory: what is created there lives as long
// as the value. A consumer that must leave nothing behind (a peek) keeps
// its consumer-group log there.
type MemObjects struct {
	mu   sync.Mutex
	objs map[string][]byte
}

// NewMemObjects returns an empty MemObjects.
func NewMemObjects() *MemObjects { return &MemObjects{objs: map[string][]byte{}} }

func checkObjectName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) {
		return fmt.Errorf("store: object name %q: want one path element", name)
	}
	return nil
}

// Create writes name unless it exists.
func (m *MemObjects) Create(ctx context.Context, name string, data []byte) error {
	if err := checkObjectName(name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objs[name]; ok {
		return fmt.Errorf("store: %s: %w", name, fs.ErrExist)
	}
	m.objs[name] = slices.Clone(data)
	return nil
}

// Get reads name.
func (m *MemObjects) Get(ctx context.Context, name string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	data, ok := m.objs[name]
	if !ok {
		return nil, fmt.Errorf("store: %s: %w", name, fs.ErrNotExist)
	}
	return slices.Clone(data), nil
}

// List returns the names that start with prefix, sorted.
func (m *MemObjects) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for name := range m.objs {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Delete removes name.
func (m *MemObjects) Delete(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objs, name)
	return nil
}
