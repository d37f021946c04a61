package synth

import (
	"fmt"
	"math/rand/v2"
	"sync"
)

// TokenModel is how token ids are drawn.
type TokenModel uint8

const (
	// TokensRandom draws every id independently, skewed towards small ids
	// with a uniform tail: about 16 bits of entropy a token, nothing for a
	// compressor to find. The default, and the benchmarks' inputs.
	TokensRandom TokenModel = iota
	// TokensText draws ids the way a tokenizer cuts text: words drawn with
	// Zipf's law from a fixed lexicon (frequent words one token with a
	// small id, rare ones two or three subword pieces), a quarter of them
	// repeating a word of the last few dozen (a text's own terms recur), one
	// system prompt for the whole run (an agent's scaffold is the same for
	// every task), and tool observations that sometimes repeat one seen
	// earlier in the trajectory (a file opened again, tests run again).
	TokensText
)

// String returns the model's name for --tokens.
func (m TokenModel) String() string {
	switch m {
	case TokensRandom:
		return "random"
	case TokensText:
		return "text"
	}
	return fmt.Sprintf("TokenModel(%d)", uint8(m))
}

// ParseTokenModel parses a --tokens value: random or text.
func ParseTokenModel(s string) (TokenModel, error) {
	switch s {
	case "random":
		return TokensRandom, nil
	case "text":
		return TokensText, nil
	}
	return 0, fmt.Errorf("synth: token model %q: want random or text", s)
}

// The text model's lexicon: lexWords word types by falling frequency.
// The first lexSingle are one token each, their ids growing with the rank
// (BPE gives its earliest, most frequent merges the smallest ids); the
// rest are two or three subword pieces drawn from lexPieces ids.
const (
	lexWords  = 1 << 15
	lexSingle = 6000
	lexPieces = 90000
	// zipfS and zipfV shape the word ranks: P(k) ∝ (zipfV + k)^-zipfS.
	zipfS = 1.1
	zipfV = 4
	// recentWords is how many of the last words a repeat draws from, and
	// repeatWord the chance that a word repeats one of them.
	recentWords = 48
	repeatWord  = 0.25
	// repeatObservation is the chance that an observation after the first
	// repeats one seen earlier in the trajectory.
	repeatObservation = 0.2
)

// lexicon holds every word's token ids: word w is ids[start[w]:start[w+1]].
type lexicon struct {
	start []int32
	ids   []uint32
}

// theLexicon is built once from a fixed seed: every run and every seed
// share the language, as real runs share a tokenizer.
var theLexicon = sync.OnceValue(func() *lexicon {
	r := rand.New(rand.NewPCG(0x6c6578, 0x69636f6e))
	lx := &lexicon{start: make([]int32, 0, lexWords+1), ids: make([]uint32, 0, 2*lexWords)}
	for w := range lexWords {
		lx.start = append(lx.start, int32(len(lx.ids)))
		if w < lexSingle {
			lx.ids = append(lx.ids, uint32(256+3*w+r.IntN(3)))
			continue
		}
		for range 2 + r.IntN(2) {
			u := r.Float64()
			lx.ids = append(lx.ids, uint32(256+u*u*lexPieces))
		}
	}
	lx.start = append(lx.start, int32(len(lx.ids)))
	return lx
})

// textTokens is a generator's state for TokensText.
type textTokens struct {
	lx     *lexicon
	zipf   *rand.Zipf
	recent [recentWords]int32
	n      int // words drawn so far
	sys    []byte
}

func newTextTokens(r *rand.Rand) *textTokens {
	return &textTokens{lx: theLexicon(), zipf: rand.NewZipf(r, zipfS, zipfV, lexWords-1)}
}

// appendTextTok appends n token ids of text, each followed by a comma;
// the last word is cut short where n ends.
func (g *gen) appendTextTok(b []byte, n int) []byte {
	tt := g.text
	for n > 0 {
		var w int32
		if tt.n >= recentWords && g.r.Float64() < repeatWord {
			w = tt.recent[g.r.IntN(recentWords)]
		} else {
			w = int32(tt.zipf.Uint64())
		}
		tt.recent[tt.n%recentWords] = w
		tt.n++
		for _, id := range tt.lx.ids[tt.lx.start[w]:tt.lx.start[w+1]] {
			if n == 0 {
				break
			}
			b = appendUint32(b, uint32(g.tokID(int(id))))
			b = append(b, ',')
			n--
		}
	}
	return b
}

// appendToks appends n token ids drawn by the configured model.
func (g *gen) appendToks(b []byte, n int) []byte {
	if g.text != nil {
		return g.appendTextTok(b, n)
	}
	return g.appendRandTok(b, n)
}

// appendSystemToks appends a first prompt's system turn body of n tokens:
// random, or with the text model the run's one system prompt (drawn
// once, at its mean length).
func (g *gen) appendSystemToks(b []byte, n int) []byte {
	tt := g.text
	if tt == nil {
		return g.appendRandTok(b, n)
	}
	if tt.sys == nil {
		tt.sys = g.appendTextTok(make([]byte, 0, 8*n), max(1, g.cfg.PromptLen/8))
	}
	return append(b, tt.sys...)
}
