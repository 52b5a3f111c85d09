package ref

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
)

// column builds one buffer per rank of nvec vectors in which every element of
// rank r holds bits[r].
func column(dt dtype.DType, nvec int, bits ...uint64) [][]byte {
	inputs := make([][]byte, len(bits))
	for r, b := range bits {
		inputs[r] = make([]byte, nvec*VectorBytes)
		for i := range nvec * VectorBytes / dt.Size() {
			store(dt, inputs[r], i, b)
		}
	}
	return inputs
}

// elements returns the element bits of buf.
func elements(dt dtype.DType, buf []byte) []uint64 {
	out := make([]uint64, len(buf)/dt.Size())
	for i := range out {
		out[i] = load(dt, buf, i)
	}
	return out
}

// perVector expands one value per vector into element bits.
func perVector(dt dtype.DType, vals ...uint64) []uint64 {
	var out []uint64
	for _, v := range vals {
		for range VectorBytes / dt.Size() {
			out = append(out, v)
		}
	}
	return out
}

type algo struct {
	name string
	fn   func(dtype.DType, [][]byte) ([]byte, error)
}

var algos = []algo{{"oneshot", OneShot}, {"twoshot", TwoShot}, {"push", Push}}

func TestReduceKnown(t *testing.T) {
	for _, c := range []struct {
		name string
		dt   dtype.DType
		in   []uint64
		want uint64
	}{
		{"bf16 1+2+3", dtype.BFloat16, []uint64{0x3F80, 0x4000, 0x4040}, 0x40C0},
		{"f16 1+2+3", dtype.Float16, []uint64{0x3C00, 0x4000, 0x4200}, 0x4600},
		{"f32 1+2+3", dtype.Float32, []uint64{0x3F800000, 0x40000000, 0x40400000}, 0x40C00000},
		// Rounded per step in bf16, 1 + 2^-8 is a tie that goes back to 1 twice;
		// accumulated in f32 and rounded once it is 1 + 2^-7.
		{"bf16 one rounding", dtype.BFloat16, []uint64{0x3F80, 0x3B80, 0x3B80}, 0x3F81},
		{"f16 sum overflows", dtype.Float16, []uint64{0x7A53, 0x7A53}, 0x7C00}, // 60000+60000
		{"f16 65504+16 = 65520 -> Inf", dtype.Float16, []uint64{0x7BFF, 0x4C00}, 0x7C00},
		{"f16 65504+15 = 65519", dtype.Float16, []uint64{0x7BFF, 0x4B80}, 0x7BFF},
		{"f16 subnormals add exactly", dtype.Float16, []uint64{0x0001, 0x0001, 0x0001}, 0x0003},
		{"bf16 -0 + -0", dtype.BFloat16, []uint64{0x8000, 0x8000}, 0x8000},
		{"f32 Inf + 1", dtype.Float32, []uint64{0x7F800000, 0x3F800000}, 0x7F800000},
		{"f32 Inf - Inf is canonical NaN", dtype.Float32, []uint64{0x7F800000, 0xFF800000}, 0x7FFFFFFF},
		{"f32 NaN payload becomes canonical", dtype.Float32, []uint64{0xFFC12345, 0x3F800000}, 0x7FFFFFFF},
		{"bf16 Inf - Inf", dtype.BFloat16, []uint64{0x7F80, 0xFF80}, 0x7FFF},
		{"f16 NaN", dtype.Float16, []uint64{0x7E01, 0x3C00}, 0x7FFF},
	} {
		for _, a := range algos {
			out, err := a.fn(c.dt, column(c.dt, 3, c.in...))
			require.NoError(t, err)
			want := perVector(c.dt, c.want, c.want, c.want)
			assert.Equalf(t, want, elements(c.dt, out), "%s %s", a.name, c.name)
		}
	}
}

// TestOrder uses a column whose bf16 sum depends on the order of the adds:
// 2^24 + 1 rounds back to 2^24 in f32, 1 - 2^24 does not.
func TestOrder(t *testing.T) {
	const big, one, negBig = 0x4B80, 0x3F80, 0xCB80
	dt := dtype.BFloat16

	// Rank order 0, 1, 2: (2^24 + 1) - 2^24 = +0.0 on every vector.
	in := column(dt, 4, big, one, negBig)
	out, err := OneShot(dt, in)
	require.NoError(t, err)
	assert.Equal(t, perVector(dt, 0, 0, 0, 0), elements(dt, out))

	// ws 3, nvec 4: part 1, so vector 0 is shard 0 (order 0,1,2 -> 0),
	// vector 1 shard 1 (order 1,2,0: (1 - 2^24) + 2^24 = 1) and vectors 2, 3
	// shard 2, which takes the remainder (order 2,0,1: 0 + 1 = 1).
	out, err = TwoShot(dt, in)
	require.NoError(t, err)
	assert.Equal(t, perVector(dt, 0, one, one, one), elements(dt, out))

	// nvec 2 < ws 3: part 0, every vector belongs to the last rank's shard.
	out, err = TwoShot(dt, column(dt, 2, big, one, negBig))
	require.NoError(t, err)
	assert.Equal(t, perVector(dt, one, one), elements(dt, out))
}

func TestTwoShotShardsOfRandomData(t *testing.T) {
	// A direct restatement of the kernel's shard loop, per vector.
	rng := rand.New(rand.NewPCG(5, 6))
	for _, ws := range []int{1, 2, 3, 5, 8, 16} {
		for _, nvec := range []int{0, 1, ws - 1, ws, 2*ws + 1, 37} {
			dt := dtype.BFloat16
			in := make([][]byte, ws)
			for r := range in {
				in[r] = Random(rng, dt, nvec*VectorBytes)
			}
			got, err := TwoShot(dt, in)
			require.NoError(t, err)
			part := nvec / ws
			want := make([]byte, nvec*VectorBytes)
			for s := range ws {
				end := (s + 1) * part
				if s == ws-1 {
					end = nvec
				}
				rotated := append(append([][]byte{}, in[s:]...), in[:s]...)
				for v := s * part; v < end; v++ {
					seg := make([][]byte, ws)
					for r := range rotated {
						seg[r] = rotated[r][v*VectorBytes : (v+1)*VectorBytes]
					}
					sum, err := OneShot(dt, seg)
					require.NoError(t, err)
					copy(want[v*VectorBytes:], sum)
				}
			}
			n, first := Compare(dt, want, got)
			require.Zerof(t, n, "ws %d nvec %d: first %+v", ws, nvec, first)
		}
	}
}

func TestPushNegativeZero(t *testing.T) {
	for _, dt := range dtype.All {
		neg := signBit(dt)
		for _, c := range []struct {
			in            []uint64
			oneshot, push uint64
		}{
			{[]uint64{0, 0}, 0, neg},
			{[]uint64{0, 0, 0, 0, 0}, 0, neg},
			{[]uint64{0, neg}, 0, neg},
			{[]uint64{neg, 0}, 0, neg},
			{[]uint64{neg, neg}, neg, neg},
		} {
			in := column(dt, 1, c.in...)
			out, err := OneShot(dt, in)
			require.NoError(t, err)
			assert.Equal(t, perVector(dt, c.oneshot), elements(dt, out), "oneshot %v %x", dt, c.in)
			out, err = Push(dt, in)
			require.NoError(t, err)
			assert.Equal(t, perVector(dt, c.push), elements(dt, out), "push %v %x", dt, c.in)
		}
	}
}

// TestPushMatchesOneShotExceptZeroColumns: sending +0.0 as -0.0 changes a sum
// only where every term is a zero; everywhere else push and one-shot agree.
func TestPushMatchesOneShotExceptZeroColumns(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dt := range dtype.All {
		const nbytes = 4096
		in := make([][]byte, 2)
		for r := range in {
			in[r] = Random(rng, dt, nbytes)
		}
		// Plant all-zero columns, which two random ranks rarely give.
		for i := range 16 {
			store(dt, in[0], 7*i, 0)
			store(dt, in[1], 7*i, uint64(i%2)*signBit(dt))
		}
		one, err := OneShot(dt, in)
		require.NoError(t, err)
		push, err := Push(dt, in)
		require.NoError(t, err)
		zeroColumns := 0
		for i := range nbytes / dt.Size() {
			a, b := load(dt, in[0], i), load(dt, in[1], i)
			if (a == 0 || a == signBit(dt)) && (b == 0 || b == signBit(dt)) {
				zeroColumns++
				assert.Equal(t, signBit(dt), load(dt, push, i), "push of a zero column is -0.0")
				continue
			}
			assert.Equal(t, load(dt, one, i), load(dt, push, i), "element %d", i)
		}
		assert.GreaterOrEqual(t, zeroColumns, 16)
	}
}

func TestReduceErrors(t *testing.T) {
	for _, a := range algos {
		_, err := a.fn(dtype.Float32, nil)
		assert.ErrorContains(t, err, "no inputs", a.name)
		_, err = a.fn(dtype.Float32, [][]byte{make([]byte, 16), make([]byte, 32)})
		assert.ErrorContains(t, err, "rank 1 has 32 bytes but rank 0 has 16", a.name)
		_, err = a.fn(dtype.Float32, [][]byte{make([]byte, 6), make([]byte, 6)})
		assert.ErrorContains(t, err, "not a whole number of f32 elements", a.name)
		_, err = a.fn(dtype.Invalid, [][]byte{make([]byte, 16)})
		assert.ErrorContains(t, err, "unsupported element type", a.name)
		assert.ErrorContains(t, err, a.name[:3], "the error names the algorithm")

		out, err := a.fn(dtype.BFloat16, [][]byte{{}, {}})
		require.NoError(t, err, "zero bytes is a valid, empty all-reduce")
		assert.Empty(t, out)
	}
}

// TestF32RoundsEveryAdd checks that float32 sums are not carried in a wider
// type: 1 + 2^-24 + 2^-24 is 1 in float32 but not in float64.
func TestF32RoundsEveryAdd(t *testing.T) {
	bits := uint64(math.Float32bits(0x1p-24))
	out, err := OneShot(dtype.Float32, column(dtype.Float32, 1, 0x3F800000, bits, bits))
	require.NoError(t, err)
	assert.Equal(t, perVector(dtype.Float32, 0x3F800000), elements(dtype.Float32, out))
}

// TestPartialVector checks a message that ends in a partial vector: its elements belong to the
// vector that holds them, so TwoShot sums them from that vector's shard owner, as the kernel
// does.
func TestPartialVector(t *testing.T) {
	// f32: 2 vectors, the last with three elements; one vector per shard (with the partial
	// vector not counted, the shards would be empty and rank 1 would own everything)
	const ws, count = 2, 7
	inputs := make([][]byte, ws)
	for r := range inputs {
		inputs[r] = make([]byte, 4*count)
		for i := range count {
			// distinct magnitudes so that the order of the adds shows in the last bit
			v := float32(1+r) * float32(math.Pow(2, float64(24*r-24))) * float32(1+i)
			binary.LittleEndian.PutUint32(inputs[r][4*i:], math.Float32bits(v))
		}
	}
	got, err := TwoShot(dtype.Float32, inputs)
	require.NoError(t, err)
	require.Len(t, got, 4*count)
	for i := range count {
		owner := min(i*4/VectorBytes, ws-1) // vector i/4, one vector per shard
		acc := math.Float32frombits(binary.LittleEndian.Uint32(inputs[owner][4*i:]))
		for k := 1; k < ws; k++ {
			acc += math.Float32frombits(binary.LittleEndian.Uint32(inputs[(owner+k)%ws][4*i:]))
		}
		assert.Equal(t, math.Float32bits(acc), binary.LittleEndian.Uint32(got[4*i:]), "element %d", i)
	}
}
