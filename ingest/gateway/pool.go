package gateway

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// WorkerInfo is a worker as rLLM's GET /admin/workers lists it.
type WorkerInfo struct {
	WorkerID       string  `json:"worker_id"`
	URL            string  `json:"url"`
	APIPath        string  `json:"api_path"`
	ModelName      *string `json:"model_name"`
	Weight         int     `json:"weight"`
	Healthy        bool    `json:"healthy"`
	ActiveRequests int64   `json:"active_requests"`
}

type worker struct {
	id, url, apiPath, model string
	weight                  int
	seed                    uint64 // hash of the id, for rendezvous scores
	healthy                 atomic.Bool
	active                  atomic.Int64
}

func (w *worker) info() WorkerInfo {
	wi := WorkerInfo{WorkerID: w.id, URL: w.url, APIPath: w.apiPath, Weight: w.weight, Healthy: w.healthy.Load(), ActiveRequests: w.active.Load()}
	if w.model != "" {
		m := w.model
		wi.ModelName = &m
	}
	return wi
}

// target is the upstream URL of an agent route tail ("/v1/chat/completions"
// or "/generate"), a decoded path: it is escaped again, so that the worker
// gets the path the gateway checked (Config.Forward), never one decoded
// twice (an agent's %252e%252e sent on as %2e%2e, a "..").
func (w *worker) target(tail, rawQuery string) string {
	var u string
	if rest, ok := strings.CutPrefix(tail, "/v1"); ok {
		u = w.url + w.apiPath + (&url.URL{Path: rest}).EscapedPath()
	} else {
		u = w.url + (&url.URL{Path: tail}).EscapedPath()
	}
	if rawQuery != "" {
		u += "?" + rawQuery
	}
	return u
}

// pool is the set of upstream workers. A session sticks to the worker with
// the highest rendezvous score of (session id, worker id) among all
// workers, so adding or removing a worker moves only the sessions whose
// best worker it is or becomes; when that worker is unhealthy the call
// goes to the least-loaded healthy worker (active requests over weight),
// and back once it recovers. Calls outside a session go least-loaded.
type pool struct {
	client   *http.Client
	interval time.Duration
	key      string // upstream API key (Config.UpstreamKey)
	log      *slog.Logger

	mu      sync.RWMutex
	workers []*worker

	stopOnce sync.Once
	stopc    chan struct{}
	donec    chan struct{}
	started  atomic.Bool
}

func newPool(client *http.Client, interval time.Duration, key string, log *slog.Logger) *pool {
	p := &pool{client: client, interval: interval, key: key, log: log, stopc: make(chan struct{}), donec: make(chan struct{})}
	if interval > 0 {
		p.started.Store(true)
		go p.healthLoop()
	} else {
		close(p.donec)
	}
	return p
}

// splitWorkerURL splits http://host:port/v1 into the base and the API path
// (default /v1), as rLLM's WorkerConfig does.
func splitWorkerURL(raw, apiPath string) (base, path string, err error) {
	u, err := url.Parse(strings.TrimRight(raw, "/"))
	if err != nil {
		return "", "", fmt.Errorf("parse worker url: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", "", fmt.Errorf("worker url %q: want http(s)://host:port", raw)
	}
	base = u.Scheme + "://" + u.Host
	if apiPath != "" {
		return base, "/" + strings.Trim(apiPath, "/"), nil
	}
	if u.Path != "" && u.Path != "/" {
		return base, u.Path, nil
	}
	return base, "/v1", nil
}

// add registers a worker (replacing one with the same id). Workers start
// healthy; the health checks and failed dials correct that.
func (p *pool) add(id, rawURL, apiPath, model string, weight int) (*worker, error) {
	base, path, err := splitWorkerURL(rawURL, apiPath)
	if err != nil {
		return nil, err
	}
	if weight < 1 {
		weight = 1
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	w := &worker{id: id, url: base, apiPath: path, model: model, weight: weight, seed: h.Sum64()}
	w.healthy.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, old := range p.workers {
		if old.id == id {
			p.workers[i] = w
			return w, nil
		}
	}
	p.workers = append(p.workers, w)
	return w, nil
}

func (p *pool) remove(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, w := range p.workers {
		if w.id == id {
			p.workers = append(p.workers[:i:i], p.workers[i+1:]...)
			return true
		}
	}
	return false
}

func (p *pool) list() []WorkerInfo {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]WorkerInfo, len(p.workers))
	for i, w := range p.workers {
		out[i] = w.info()
	}
	return out
}

// score is the rendezvous score of a session on a worker (splitmix64 of
// the two hashes).
func score(session uint64, w *worker) uint64 {
	x := session ^ w.seed
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// pick returns the worker for a call of session (""  for none), skipping
// tried ones; nil when there is none left.
func (p *pool) pick(session string, tried []*worker) *worker {
	p.mu.RLock()
	defer p.mu.RUnlock()
	skip := func(w *worker) bool {
		for _, t := range tried {
			if t == w {
				return true
			}
		}
		return false
	}
	if session != "" {
		h := fnv.New64a()
		h.Write([]byte(session))
		sh := h.Sum64()
		var best *worker
		var bestScore uint64
		for _, w := range p.workers {
			if s := score(sh, w); best == nil || s > bestScore {
				best, bestScore = w, s
			}
		}
		if best != nil && best.healthy.Load() && !skip(best) {
			return best
		}
	}
	var pick *worker
	var load float64
	for pass := 0; pass < 2 && pick == nil; pass++ { // healthy first, then any
		for _, w := range p.workers {
			if skip(w) || (pass == 0 && !w.healthy.Load()) {
				continue
			}
			if l := float64(w.active.Load()) / float64(w.weight); pick == nil || l < load {
				pick, load = w, l
			}
		}
	}
	return pick
}

func (p *pool) healthLoop() {
	defer close(p.donec)
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-p.stopc:
			return
		case <-t.C:
			p.checkAll()
		}
	}
}

func (p *pool) checkAll() {
	p.mu.RLock()
	ws := append([]*worker(nil), p.workers...)
	p.mu.RUnlock()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := p.check(w)
			if was := w.healthy.Swap(ok); was != ok {
				p.log.Info("gateway: worker health changed", "worker_id", w.id, "url", w.url, "healthy", ok)
			}
		}()
	}
	wg.Wait()
}

func (p *pool) check(w *worker) bool {
	ctx, cancel := context.WithTimeout(context.Background(), min(max(p.interval, time.Second), 2*time.Second)) // a short interval does not make a loaded worker unhealthy
	defer cancel()
	select {
	case <-p.stopc:
		cancel()
	default:
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url+"/health", nil)
	if err != nil {
		return false
	}
	if p.key != "" {
		req.Header.Set("Authorization", "Bearer "+p.key)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode/100 == 2
}

func (p *pool) stop() {
	p.stopOnce.Do(func() { close(p.stopc) })
	<-p.donec
}

var errNoWorker = errors.New("no upstream worker")
