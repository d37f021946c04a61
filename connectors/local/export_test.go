package local

// Crash drops what s holds, the lock included, as the death of its
// process would: nothing is flushed or cleaned up.
func Crash(s *Store) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dl != nil && s.dl.f != nil {
		s.dl.f.Close() // the buffered letters are lost
	}
	if s.man != nil {
		s.man.Close()
		s.man = nil
	}
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
	s.dl = nil
}
