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

// Overlay is an Objects that reads base as it was when the overlay was
// made and writes only to memory: what is created and deleted through it
// is seen through it and never reaches base, and what others add to base
// later is not seen (a record of theirs would fork the log the overlay
// continues). A member that peeks into a consumer group (joins it as of
// now, leaves nothing behind) keeps its log there.
type Overlay struct {
	base Objects
	mem  *MemObjects
	mu   sync.Mutex
	seen map[string]bool // base's names when the overlay was made, less those deleted through it
}

// NewOverlay returns an Overlay over base as it is now.
func NewOverlay(ctx context.Context, base Objects) (*Overlay, error) {
	names, err := base.List(ctx, "")
	if err != nil {
		return nil, err
	}
	o := &Overlay{base: base, mem: NewMemObjects(), seen: make(map[string]bool, len(names))}
	for _, n := range names {
		o.seen[n] = true
	}
	return o, nil
}

func (o *Overlay) inBase(name string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen[name]
}

// Create writes name in memory unless it exists in memory or in base.
func (o *Overlay) Create(ctx context.Context, name string, data []byte) error {
	if err := checkObjectName(name); err != nil {
		return err
	}
	if o.inBase(name) {
		return fmt.Errorf("store: %s: %w", name, fs.ErrExist)
	}
	return o.mem.Create(ctx, name, data)
}

// Get reads name from memory, else from base.
func (o *Overlay) Get(ctx context.Context, name string) ([]byte, error) {
	if o.inBase(name) {
		return o.base.Get(ctx, name)
	}
	return o.mem.Get(ctx, name)
}

// List returns the names in memory and in base that start with prefix.
func (o *Overlay) List(ctx context.Context, prefix string) ([]string, error) {
	out, err := o.mem.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	for n := range o.seen {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	o.mu.Unlock()
	slices.Sort(out)
	return out, nil
}

// Delete hides name (base keeps it).
func (o *Overlay) Delete(ctx context.Context, name string) error {
	if err := o.mem.Delete(ctx, name); err != nil {
		return err
	}
	o.mu.Lock()
	delete(o.seen, name)
	o.mu.Unlock()
	return nil
}
