package schemas

// MaxPolicyVersion is the largest policy version a client may set: a
// trainer's (flags, tickets, actions, acknowledgements) and the gateway's
// weight version. 2^53 is exact in a float64 as JSON clients hold numbers,
// so the staleness arithmetic never overflows. Records may carry any
// non-negative 64-bit version (the partition folder names it), as they
// always could.
const MaxPolicyVersion = 1 << 53
