package transform

import (
	"math/rand"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// A step's hash sees every element of its lists: changing any one token,
// logprob or message byte (short or long fields) changes it.
func TestStepHashSeesEveryElement(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	mk := func(n int) *schemas.Step {
		s := &schemas.Step{StepID: "s", TaskID: "t", TrajectoryID: "r", Messages: make([]byte, n)}
		for i := 0; i < n; i++ {
			s.PromptIDs = append(s.PromptIDs, int32(rng.Intn(1000)))
			s.ResponseLogprobs = append(s.ResponseLogprobs, -rng.Float32())
		}
		rng.Read(s.Messages)
		return s
	}
	for _, n := range []int{1, 20, 32, 33, 500} {
		s := mk(n)
		h := stepHash(s)
		for i := 0; i < n; i++ {
			s.PromptIDs[i]++
			if stepHash(s) == h {
				t.Fatalf("n %d: prompt_ids[%d] changed, hash did not", n, i)
			}
			s.PromptIDs[i]--
			s.ResponseLogprobs[i] /= 2
			if stepHash(s) == h {
				t.Fatalf("n %d: response_logprobs[%d] changed, hash did not", n, i)
			}
			s.ResponseLogprobs[i] *= 2
			s.Messages[i] ^= 1
			if stepHash(s) == h {
				t.Fatalf("n %d: messages[%d] changed, hash did not", n, i)
			}
			s.Messages[i] ^= 1
		}
		if stepHash(s) != h {
			t.Fatalf("n %d: same content, another hash", n)
		}
	}
}

// BenchmarkStepHash hashes steps of the ingest benchmark's size (700
// prompt tokens, 256 response tokens and logprobs, 2.4 KB of messages).
func BenchmarkStepHash(b *testing.B) {
	rng := rand.New(rand.NewSource(1))
	s := &schemas.Step{StepID: "task-000001/r3#2", TaskID: "task-000001", TrajectoryID: "task-000001/r3", Messages: make([]byte, 2400)}
	for i := 0; i < 700; i++ {
		s.PromptIDs = append(s.PromptIDs, int32(rng.Intn(151000)))
	}
	for i := 0; i < 256; i++ {
		s.ResponseIDs = append(s.ResponseIDs, int32(rng.Intn(151000)))
		s.ResponseLogprobs = append(s.ResponseLogprobs, -rng.Float32())
	}
	b.SetBytes(int64(4*(700+256+256) + 2400))
	for b.Loop() {
		stepHash(s)
	}
}
