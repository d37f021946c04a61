package schemas

// MaxPolicyVersion is the largest policy version the pipeline takes, from
// records (ingest dead-letters a larger one as invalid_value), from the
// gateway's weight version and from trainers: 2^53, exact in a float64 as
// JSON clients hold numbers, so staleness arithmetic never overflows and a
// version always names a sane partition folder.
const MaxPolicyVersion = 1 << 53
