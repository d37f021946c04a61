package schemas

// DeadLetter is a record that will not be written, with why. Record holds
// the original bytes (for a too_large record only its first bytes; then
// Truncated is set and Size is the full length).
type DeadLetter struct {
	Reason    Reason
	Error     string
	Source    Source
	Record    []byte
	Truncated bool
	Size      int64
}
