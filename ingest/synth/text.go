package synth

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"unicode/utf8"
)

// words is the vocabulary for message text. Every entry is already valid
// inside a JSON string (the newline entries are the two characters \n).
// There are exactly 256 entries so that one byte of randomness picks one.
var words = func() [256]string {
	src := strings.Fields(`
the a an of to and in is that for it as with be on by this are we let so
then thus hence therefore since because if when where which what how why
not but or all each every some any no one two three four five six seven
eight nine ten zero first second third last next step answer result value
number sum product difference quotient ratio total equation solve solution
problem given find compute check verify assume suppose note observe recall
function variable integer prime factor divisor multiple remainder modulo
square root power exponent log sin cos angle triangle circle radius area
perimeter volume length width height side point line slope intercept graph
x y z n k m a_n f(x) g(x) = + - * / < > <= >= ( ) [ ] 0 1 2 3 4 5 6 7 8 9
10 12 15 16 20 24 25 36 42 48 64 100 128 256 1000 pi 1/2 2/3 x^2 n+1
probability expected count ways choose permutation combination sequence
series limit derivative integral matrix vector determinant eigenvalue
code python list dict loop range print output error test case input string
array index sort search binary tree graph node edge path cost dp memo
recursion base hold holds true false case cases both either only also
again directly simply carefully plug substitute simplify expand rearrange
divide multiply add subtract both sides get gives yields equals means
consider use using apply rule formula identity lemma theorem proof claim
wait hmm actually correct incorrect double-check recompute mistake fix
`)
	var w [256]string
	extra := []string{`\n`, `\n\n`, `.`, `,`, `:`, `$`, `$$`, `\\frac{1}{2}`, `\\cdot`, `\\sqrt{2}`}
	i := 0
	for _, s := range extra {
		w[i] = s
		i++
	}
	for _, s := range src {
		if i == len(w) {
			break
		}
		w[i] = s
		i++
	}
	for ; i < len(w); i++ {
		w[i] = src[i%len(src)]
	}
	return w
}()

// unicodeBits are non-ASCII snippets sprinkled into ~1% of message contents
// to exercise UTF-8 handling downstream.
var unicodeBits = []string{"é", "数学", "naïve café", "∑ᵢ xᵢ ≤ π", "Ωmega", "😀", "日本語のテスト", "Ürün"}

// snippet is a tool call (python code) with its output, both pre-escaped
// for direct inclusion in JSON string values.
type snippet struct {
	args   string // the arguments JSON, escaped as a JSON string body
	output string // the tool output, escaped as a JSON string body
}

var snippets = func() []snippet {
	raw := []struct{ code, out string }{
		{"print(1)", "1"},
		{"print(sum(range(1, 101)))", "5050"},
		{"import math\nprint(math.comb(10, 3))", "120"},
		{"from sympy import symbols, solve\nx = symbols('x')\nprint(solve(x**2 - 5*x + 6, x))", "[2, 3]"},
		{"def f(n):\n    return n * (n + 1) // 2\nprint(f(42))", "903"},
		{"import numpy as np\nA = np.array([[2, 1], [1, 3]])\nprint(np.linalg.det(A))", "5.000000000000001"},
		{"print([p for p in range(2, 30) if all(p % d for d in range(2, p))])", "[2, 3, 5, 7, 11, 13, 17, 19, 23, 29]"},
		{"print(2**64 % 1000007)", "582344008"},
		{"s = \"hello\"\nprint(s[::-1], len(s))", "olleh 5"},
		{"print(1/0)", "Traceback (most recent call last):\n  File \"<stdin>\", line 1, in <module>\nZeroDivisionError: division by zero"},
		{"from fractions import Fraction\nprint(Fraction(3, 4) + Fraction(5, 6))", "19/12"},
		{"import itertools\nprint(len(list(itertools.permutations(range(5)))))", "120"},
	}
	out := make([]snippet, len(raw))
	for i, r := range raw {
		args, err := json.Marshal(map[string]string{"code": r.code})
		if err != nil {
			panic(err)
		}
		out[i] = snippet{args: jsonBody(string(args)), output: jsonBody(r.out)}
	}
	return out
}()

// jsonBody returns s escaped as the inside of a JSON string (no quotes).
func jsonBody(s string) string {
	b := appendJSONString(nil, s)
	return string(b[1 : len(b)-1])
}

// appendJSONString appends s as a JSON string literal. Non-ASCII UTF-8 is
// copied as is; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, "\ufffd"...)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}

// appendWords appends n space-separated words drawn from the word list.
func appendWords(b []byte, r *rand.Rand, n int) []byte {
	var x uint64
	for i := 0; i < n; i++ {
		if i&7 == 0 {
			x = r.Uint64()
		}
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, words[byte(x)]...)
		x >>= 8
	}
	return b
}

// appendMaybeUnicode appends a non-ASCII snippet to ~1% of contents.
func appendMaybeUnicode(b []byte, r *rand.Rand) []byte {
	if r.IntN(100) == 0 {
		b = append(b, ' ')
		b = append(b, unicodeBits[r.IntN(len(unicodeBits))]...)
	}
	return b
}

var (
	systemPrompts = []string{
		"You are a helpful assistant. Solve the problem step by step and put the final answer in \\\\boxed{}.",
		"You are an expert mathematician with access to a Python tool. Think carefully, use the tool to verify calculations, and give the final answer in \\\\boxed{}.",
		"You are a coding agent. You can run Python code by calling the python tool. When you are done, reply with the final answer only.",
	}
	userPrefixes = []string{
		"Solve the following problem:\\n\\n",
		"Question: ",
		"Problem: ",
		"Please answer the question below. ",
	}
	finalPhrases = []string{
		" Therefore the answer is \\\\boxed{",
		" So the final answer is \\\\boxed{",
		" The answer is \\\\boxed{",
	}
	datasets = []string{"gsm8k", "math500", "aime24", "deepscaler", "codecontests", "swe-gym"}
	envs     = []string{"math-python", "sandbox", "swe", "search"}
)

// roleSystemPrompt is the system prompt body for a multi-agent role.
func roleSystemPrompt(role string) string {
	return jsonBody("You are the " + role + " agent in a multi-agent system. Collaborate with the other agents, use the python tool when useful, and report your result clearly.")
}
