package ingest

import (
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// decodeBoth decodes line with and without the fast list paths.
func decodeBoth(line string) (fast, slow Record, fastErr, slowErr error) {
	var d Decoder
	fast, fastErr = d.Decode([]byte(line))
	fastLists = false
	defer func() { fastLists = true }()
	var d2 Decoder
	slow, slowErr = d2.Decode([]byte(line))
	return
}

// stepWith makes a step with as many response tokens as logprobs has
// commas plus one, so that the values are compared, not a length error.
func stepWith(prompt, logprobs string) string {
	n := strings.Count(logprobs, ",") + 1
	resp := strings.TrimSuffix(strings.Repeat("1,", n), ",")
	return `{"type":"step","step_id":"s","task_id":"t","trajectory_id":"r","step_index":0,"policy_version":1,` +
		`"prompt_ids":` + prompt + `,"response_ids":[` + resp + `],"response_logprobs":` + logprobs +
		`,"model":"` + strings.Repeat("m", 100) + `"}` // room after the lists for the 64-byte block paths
}

func sameRecords(t *testing.T, line string) {
	t.Helper()
	fast, slow, fe, se := decodeBoth(line)
	if fmt.Sprint(fe) != fmt.Sprint(se) {
		t.Fatalf("%s\nfast error %v, general error %v", line, fe, se)
	}
	if fe != nil {
		return
	}
	compared++
	if !reflect.DeepEqual(fast.Step.PromptIDs, slow.Step.PromptIDs) {
		t.Fatalf("%s\nprompt_ids %v vs %v", line, fast.Step.PromptIDs, slow.Step.PromptIDs)
	}
	fl, sl := fast.Step.ResponseLogprobs, slow.Step.ResponseLogprobs
	if len(fl) != len(sl) {
		t.Fatalf("%s\nlogprobs %v vs %v", line, fl, sl)
	}
	for i := range fl {
		if math.Float32bits(fl[i]) != math.Float32bits(sl[i]) {
			t.Fatalf("%s\nlogprob %d: %v (%x) vs %v (%x)", line, i, fl[i], math.Float32bits(fl[i]), sl[i], math.Float32bits(sl[i]))
		}
	}
}

// compared counts records whose values were compared.
var compared int

func TestFastListsAgree(t *testing.T) {
	for _, c := range []struct{ prompt, logprobs string }{
		{"[]", "[-0.5,-1]"},
		{"[ 1 , 2 ,3 ]", "[ -0.0132 , -1.204,-0.0007 ]"},
		{"[0,2147483647]", "[0,-0,1e-5,-1E+2,123456789012345678901234567890,1e-400,-4.9e-324]"},
		{"[2147483648]", "[1e39]"},                         // out of range: general path's errors
		{"[3.0,1e3,012]", "[NaN]"},                         // unusual spellings
		{"[-1]", "[Infinity]"},                             // negative id
		{"[1,]", "[1.]"},                                   // syntax
		{"[99999999999]", "[0.1,0.2,0.30000000000000004]"}, // 11 digits
		{"[1 2]", "[-.5]"},
		{"[\"1\"]", "[true]"},
		// 16 significant digits, the mantissa over 2^53 (float64 would
		// round it before the division), next to a float32 rounding tie:
		// rounded twice they would give the neighbouring float32.
		{"[1]", "[-9.840058803558349,-9.494114398956299,-9.448959827423097]"},
	} {
		sameRecords(t, stepWith(c.prompt, "[-0.25]"))
		sameRecords(t, stepWith("[1]", c.logprobs))
	}
	rng := rand.New(rand.NewSource(1))
	for n := 0; n < 3000; n++ {
		var ids, lps []string
		for k := 0; k < 1+rng.Intn(20); k++ {
			ids = append(ids, fmt.Sprint(rng.Int63n(1<<31)))
			var v float64
			switch rng.Intn(4) {
			case 0:
				v = -rng.ExpFloat64()
			case 1:
				v = -rng.Float64() * math.Pow(10, float64(-rng.Intn(30)))
			case 2:
				v = float64(float32(-rng.ExpFloat64()))
			default:
				v = -float64(rng.Intn(1000)) / 1000
			}
			format := []byte{'g', 'e', 'f'}[rng.Intn(3)]
			lps = append(lps, strconvFormat(v, format, rng.Intn(20)-1))
		}
		sameRecords(t, stepWith("["+strings.Join(ids, ",")+"]", "["+strings.Join(lps, ", ")+"]"))
	}
	if compared < 3000 {
		t.Fatalf("only %d records decoded without error: the values were hardly compared", compared)
	}
}

// Token-id lists as intBlocks meets them: long enough to span several
// 64-byte blocks, numbers of 1 to 10 digits, Python's ", " and other
// blanks, and now and then something it must leave to the other paths (a
// leading zero, a sign, a fraction, a blank before a comma, two commas):
// the records decode as with the general path, with blocks on and off.
func TestIntBlocksAgree(t *testing.T) {
	before := compared
	rng := rand.New(rand.NewSource(2))
	odd := []string{"01", "-1", "1.5", "1e3", " ,", ",,", "\t", "\n", "2147483648", "99999999999", "\"7\"", "]"}
	for n := 0; n < 4000; n++ {
		var b strings.Builder
		b.WriteString("[")
		sep := []string{",", ", ", ",  "}[rng.Intn(3)]
		count := 1 + rng.Intn(120)
		for k := 0; k < count; k++ {
			if k > 0 {
				b.WriteString(sep)
			}
			if rng.Intn(400) == 0 {
				b.WriteString(odd[rng.Intn(len(odd))])
				continue
			}
			digits := 1 + rng.Intn(rng.Intn(10)+1)
			b.WriteString(fmt.Sprint(rng.Int63n(int64(math.Pow10(digits)))))
		}
		b.WriteString("]")
		line := stepWith(b.String(), "[-0.25]")
		for _, blocks := range []bool{true, false} {
			blockInts = blocks
			sameRecords(t, line)
		}
		blockInts = true
	}
	if compared-before < 4000 {
		t.Fatalf("only %d records decoded without error", compared-before)
	}
}

// Long logprob lists followed by more of the record: the generator's and
// Python's spellings, integers, -0, long fractions, and now and then
// something the fast path must leave to the general one (exponents, a
// leading zero, '+', NaN, 16+ digits, a blank before a comma): the
// records decode as with the general path.
func TestLongFloatListsAgree(t *testing.T) {
	before := compared
	rng := rand.New(rand.NewSource(3))
	odd := []string{"1e-5", "-1E+2", "00.5", "+0.5", "NaN", "-.5", "1.", "0.1234567890123456789", "12345678.5",
		"-0.000000000000001", " ,", ",,", "\"x\"", "1e39", "-0", "0"}
	for n := 0; n < 4000; n++ {
		var b strings.Builder
		b.WriteString("[")
		sep := []string{",", ", ", ",  "}[rng.Intn(3)]
		count := 1 + rng.Intn(100)
		for k := 0; k < count; k++ {
			if k > 0 {
				b.WriteString(sep)
			}
			if rng.Intn(300) == 0 {
				b.WriteString(odd[rng.Intn(len(odd))])
				continue
			}
			var v float64
			switch rng.Intn(4) {
			case 0:
				v = -rng.ExpFloat64() * math.Pow(10, float64(rng.Intn(4)))
			case 1:
				v = -rng.Float64() * math.Pow(10, float64(-rng.Intn(8)))
			case 2:
				v = float64(-rng.Intn(100))
			default:
				v = float64(float32(-rng.ExpFloat64()))
			}
			b.WriteString(strconvFormat(v, []byte{'f', 'g'}[rng.Intn(2)], rng.Intn(14)))
		}
		b.WriteString("]")
		resp := strings.TrimSuffix(strings.Repeat("1,", strings.Count(b.String(), ",")+1), ",")
		line := `{"type":"step","step_id":"s","task_id":"t","trajectory_id":"r","step_index":0,"policy_version":1,` +
			`"response_logprobs":` + b.String() + `,"response_ids":[` + resp + `],"prompt_ids":[1],"model":"` + strings.Repeat("m", 100) + `"}`
		sameRecords(t, line)
	}
	if compared-before < 2000 {
		t.Fatalf("only %d records decoded without error", compared-before)
	}
}

func strconvFormat(v float64, format byte, prec int) string {
	return fmt.Sprintf("%."+fmt.Sprint(max(prec, 0))+string(format), v)
}

func FuzzFastLists(f *testing.F) {
	f.Add("[1,2,3]", "[-0.5,-1e-3]")
	f.Add("[0]", "[1e400]")
	f.Add("[ 7 ]", "[-0.0000001234567890123456789]")
	f.Add("[151644,8948,198,10650,59403,645,87707,95234,107164,256,0,955,102486,116919,55,14928,8,34764]", "[-0.5]")
	f.Add("[1]", "[-5.08137,-0.0000952341,-0.0000345189,-0.0318915,-0.000584974,-0.0128856,-0.0104683,-8.07206]")
	f.Add("[1]", "[-5.08137, -0.0000952341, -0.0000345189, -0.0318915, -0.000584974, -0.0128856, -0.0104683, -8]")
	f.Add("[151644, 8948, 198, 10650, 59403, 645, 87707, 95234, 107164, 256, 0, 955, 102486, 116919, 55]", "[-0.5]")
	f.Fuzz(func(t *testing.T, prompt, logprobs string) {
		sameRecords(t, stepWith(prompt, logprobs))
	})
}

// skipStr must end where str ends, with the same error and repair count.
func sameSkip(t *testing.T, in string) {
	t.Helper()
	var a, b lexer
	a.reset([]byte(in))
	b.reset([]byte(in))
	_, errA := a.str()
	errB := b.skipStr()
	if (errA == nil) != (errB == nil) || (errA == nil && (a.pos != b.pos || a.repaired != b.repaired)) {
		t.Fatalf("%q: str (%v, pos %d, repaired %d), skipStr (%v, pos %d, repaired %d)", in, errA, a.pos, a.repaired, errB, b.pos, b.repaired)
	}
}

func TestSkipStrAgrees(t *testing.T) {
	for _, in := range []string{
		`""`, `"plain ascii text longer than eight bytes"`, `"tab\tand\nnewline escapes \" \\ \/ \u00e9"`,
		`"pair \ud83d\ude00 and lone \ud83d and \ude00 end"`, "\"raw \xff\xfe bytes and \xc3\xa9\"", "\"control \x01\"",
		`"unterminated`, `"bad \x escape"`, `"\u12"`, "\"" + strings.Repeat("é", 20) + "\"",
	} {
		sameSkip(t, in)
	}
}

func FuzzSkipStr(f *testing.F) {
	f.Add(`"a\nb\u00e9\ud800"`)
	f.Add("\"\xff long enough to take the eight-byte path \\\"\"")
	f.Fuzz(func(t *testing.T, s string) { sameSkip(t, `"`+s) })
}
