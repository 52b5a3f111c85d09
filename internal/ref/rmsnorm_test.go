package ref

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

// float64Fused is the fused call computed in float64 from the same inputs, with
// ResidualOut rounded to dt as the kernels store it (the norm's input).
func float64Fused(dt dtype.DType, inputs [][]byte, residual, gamma []byte, hidden int, eps float64) (resid, norm []float64) {
	n := len(inputs[0]) / dt.Size()
	resid = make([]float64, n)
	norm = make([]float64, n)
	for i := range n {
		var s float64
		for _, in := range inputs {
			s += float64(value(dt, load(dt, in, i)))
		}
		s += float64(value(dt, load(dt, residual, i)))
		resid[i] = s
	}
	for row := 0; row < n/hidden; row++ {
		var ss float64
		x := make([]float64, hidden)
		for e := range hidden {
			x[e] = float64(value(dt, narrow(dt, float32(resid[row*hidden+e]))))
			ss += x[e] * x[e]
		}
		inv := 1 / math.Sqrt(ss/float64(hidden)+eps)
		for e := range hidden {
			norm[row*hidden+e] = x[e] * inv * float64(value(dt, load(dt, gamma, e)))
		}
	}
	return resid, norm
}

// TestFusedAgainstFloat64 checks both outputs of both orders against float64 arithmetic:
// within a few units of the element type's last place (f32 sums of 8 ranks and 2048 squares).
func TestFusedAgainstFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, dt := range dtype.All {
		ulp := map[dtype.DType]float64{dtype.Float32: 1e-5, dtype.Float16: 2e-3, dtype.BFloat16: 1.6e-2}[dt]
		for _, algo := range []FusedAlgo{FusedOneShot, FusedTwoShot, FusedPush} {
			const ws, rows, hidden = 8, 5, 2048
			inputs := make([][]byte, ws)
			for r := range inputs {
				inputs[r] = Activations(rng, dt, rows*hidden, 2)
			}
			residual := Activations(rng, dt, rows*hidden, 4)
			gamma := Activations(rng, dt, hidden, 1.5)
			f := Fused{DType: dt, Algo: algo, Hidden: hidden, Threads: 256, Eps: 1e-6}
			resid, norm, err := f.Run(inputs, residual, gamma)
			require.NoError(t, err)
			wantR, wantN := float64Fused(dt, inputs, residual, gamma, hidden, 1e-6)
			for i := range wantR {
				got := float64(value(dt, load(dt, resid, i)))
				assert.InDelta(t, wantR[i], got, 4*ulp*math.Max(1, math.Abs(wantR[i])), "%v %d: ResidualOut[%d]", dt, algo, i)
				got = float64(value(dt, load(dt, norm, i)))
				assert.InDelta(t, wantN[i], got, 2*ulp*math.Max(0.25, math.Abs(wantN[i])), "%v %d: NormOut[%d]", dt, algo, i)
				if t.Failed() {
					return
				}
			}
		}
	}
}

// TestFusedOrder pins the order of the sums: one-shot adds the ranks from 0, two-shot from
// the row's owner, and the residual last; values where the order changes the f32 result.
func TestFusedOrder(t *testing.T) {
	const hidden = 4 // f32: one vector per row
	row := func(v float32) []byte {
		b := make([]byte, 4*hidden)
		for e := range hidden {
			store(dtype.Float32, b, e, uint64(math.Float32bits(v)))
		}
		return b
	}
	cat := func(a, b []byte) []byte { return append(append([]byte{}, a...), b...) }
	// rank 0: 1e8, rank 1: 1, rank 2: -1e8, residual 1. Rank order: (1e8+1)-1e8 = 0, +1 = 1.
	// From rank 1 (the owner of row 1 of 2 rows among 3 ranks): (1+(-1e8))+1e8 = 0, + 1 = 1;
	// from rank 2 (no band: row 1 is rank 1's) it would be (-1e8+1e8)+1 = 0, + 1 = 2.
	inputs := [][]byte{cat(row(1e8), row(1e8)), cat(row(1), row(1)), cat(row(-1e8), row(-1e8))}
	residual := cat(row(1), row(1))
	f := Fused{DType: dtype.Float32, Algo: FusedOneShot, Hidden: hidden, Threads: 32, NoNorm: true}
	got, norm, err := f.Run(inputs, residual, nil)
	require.NoError(t, err)
	assert.Nil(t, norm)
	assert.Equal(t, float32(1), math.Float32frombits(uint32(load(dtype.Float32, got, 0))))
	assert.Equal(t, float32(1), math.Float32frombits(uint32(load(dtype.Float32, got, hidden))))
	// two-shot, 2 rows over 3 ranks: bands [0,0) for rank 0, [0,1) rank 1, [1,2) rank 2.
	f.Algo = FusedTwoShot
	got, _, err = f.Run(inputs, residual, nil)
	require.NoError(t, err)
	// row 0 from rank 1: (1 - 1e8) + 1e8 = 0 in f32, + 1 = 1
	assert.Equal(t, float32(1), math.Float32frombits(uint32(load(dtype.Float32, got, 0))))
	// row 1 from rank 2: (-1e8 + 1e8) + 1 = 1, + 1 = 2
	assert.Equal(t, float32(2), math.Float32frombits(uint32(load(dtype.Float32, got, hidden))))
}

// TestFusedPushZeros pins where the push order differs from the one-shot order: an element
// whose inputs are all +0.0 sums to -0.0 (sent as -0.0), which a -0.0 residual keeps and a
// +0.0 residual turns into +0.0; everything else is the one-shot's result.
func TestFusedPushZeros(t *testing.T) {
	const hidden = 8 // bf16: one vector per row
	negZero := uint64(signBit(dtype.BFloat16))
	rng := rand.New(rand.NewPCG(3, 4))
	inputs := [][]byte{Activations(rng, dtype.BFloat16, 2*hidden, 1), Activations(rng, dtype.BFloat16, 2*hidden, 1)}
	residual := Activations(rng, dtype.BFloat16, 2*hidden, 1)
	gamma := Activations(rng, dtype.BFloat16, hidden, 1)
	// element 0: all inputs +0.0, residual -0.0; element 1: all +0.0, residual +0.0;
	// element 2: inputs +0.0 and -0.0, residual -0.0
	for r := range inputs {
		store(dtype.BFloat16, inputs[r], 0, 0)
		store(dtype.BFloat16, inputs[r], 1, 0)
	}
	store(dtype.BFloat16, inputs[1], 2, negZero)
	store(dtype.BFloat16, inputs[0], 2, 0)
	store(dtype.BFloat16, residual, 0, negZero)
	store(dtype.BFloat16, residual, 1, 0)
	store(dtype.BFloat16, residual, 2, negZero)
	f := Fused{DType: dtype.BFloat16, Algo: FusedOneShot, Hidden: hidden, Threads: 32, Eps: 1e-6}
	oneR, oneN, err := f.Run(inputs, residual, gamma)
	require.NoError(t, err)
	f.Algo = FusedPush
	pushR, pushN, err := f.Run(inputs, residual, gamma)
	require.NoError(t, err)
	assert.Equal(t, uint64(0), load(dtype.BFloat16, oneR, 0), "one-shot: +0 + -0 = +0")
	assert.Equal(t, negZero, load(dtype.BFloat16, pushR, 0), "push: -0 + -0 = -0")
	assert.Equal(t, uint64(0), load(dtype.BFloat16, pushR, 1), "push: -0 + +0 = +0")
	assert.Equal(t, negZero, load(dtype.BFloat16, pushR, 2), "push: -0 + -0 + -0 = -0")
	assert.Equal(t, uint64(0), load(dtype.BFloat16, oneR, 2), "one-shot: +0 + -0 + -0 = +0")
	for i := 1; i < 2*hidden; i++ {
		if i == 2 {
			continue
		}
		assert.Equal(t, load(dtype.BFloat16, oneR, i), load(dtype.BFloat16, pushR, i), "ResidualOut[%d]", i)
	}
	// the rows' inv is the same (a zero's square is +0 either way), and the norm of a signed
	// zero is a zero of the sign it had, times gamma's
	for i := range 2 * hidden {
		want := load(dtype.BFloat16, oneN, i)
		if i == 0 || i == 2 {
			want ^= negZero
		}
		assert.Equal(t, want, load(dtype.BFloat16, pushN, i), "NormOut[%d]", i)
	}
}

// TestWarpTree pins the tree: lane i adds lane i+d for d = 16..1, so lane 0's sum of these
// values depends on the pairing (a left-to-right sum gives another f32 result).
func TestWarpTree(t *testing.T) {
	var lanes [32]float32
	lanes[0], lanes[16], lanes[1] = 1e8, -1e8, 1
	for i := 2; i < 32; i++ {
		if i != 16 {
			lanes[i] = 0.25
		}
	}
	seq := float32(0)
	for _, v := range lanes {
		seq = float32(seq + v)
	}
	got := warpTree(lanes[:])
	// pairs: lane 0 gets 1e8 + -1e8 = 0 at d=16, then the others add exactly: 1 + 29*0.25
	assert.Equal(t, float32(1+29*0.25), got)
	assert.NotEqual(t, seq, got, "a sequential sum rounds 1 away")
}

func TestFusedErrors(t *testing.T) {
	in := [][]byte{make([]byte, 64), make([]byte, 64)}
	ok := Fused{DType: dtype.BFloat16, Algo: FusedOneShot, Hidden: 16, Threads: 32}
	_, _, err := ok.Run(in, make([]byte, 64), make([]byte, 32))
	require.NoError(t, err)
	for name, f := range map[string]Fused{
		"algo":    {DType: dtype.BFloat16, Hidden: 16, Threads: 32},
		"hidden":  {DType: dtype.BFloat16, Algo: FusedOneShot, Hidden: 12, Threads: 32},
		"threads": {DType: dtype.BFloat16, Algo: FusedOneShot, Hidden: 16, Threads: 48},
		// more warps than a block holds, and than the block sum has room for
		"threads past a block": {DType: dtype.BFloat16, Algo: FusedOneShot, Hidden: 16, Threads: 1056},
	} {
		_, _, err := f.Run(in, make([]byte, 64), make([]byte, 32))
		assert.Error(t, err, name)
	}
	_, _, err = ok.Run(in, make([]byte, 32), make([]byte, 32))
	assert.ErrorContains(t, err, "residual")
	_, _, err = ok.Run(in, make([]byte, 64), make([]byte, 16))
	assert.ErrorContains(t, err, "gamma")
}
