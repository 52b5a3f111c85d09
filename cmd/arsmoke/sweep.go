package main

import (
	"context"
	"fmt"
)

// sweep measures every algorithm of c at every size, out of place then in
// place, and adds the rows to r. With --backend both, NCCL follows goccl at
// each size; it is measured once per size and placement and shown in every
// block. It stops at the first error, which names the case; rows of sizes
// not fully measured are left out.
func sweep(ctx context.Context, eng engine, c config, world int, r *report, prog *progress) error {
	sizes := c.sizes()
	steps := 2 * len(sizes) * len(c.algos)
	if c.backend == backendBoth {
		steps += 2 * len(sizes)
	}
	prog.start(steps)
	defer prog.clear()
	type key struct {
		bytes   int64
		inPlace bool
	}
	ncclDone := map[key]Measurement{}
	// measure runs one case, or returns NCCL's earlier measurement of it.
	measure := func(backend, algo string, bytes int64, inPlace bool) (Measurement, error) {
		k := key{bytes, inPlace}
		if m, ok := ncclDone[k]; ok && backend == backendNCCL {
			return m, nil
		}
		name := fmt.Sprintf("%s, %d B %s", algo, bytes, placement(inPlace))
		if err := ctx.Err(); err != nil {
			return Measurement{}, fmt.Errorf("interrupted before %s: %w", name, err)
		}
		prog.step(name)
		got, err := eng.Run(ctx, Case{
			Bytes:   bytes,
			DType:   c.dtype,
			Backend: backend,
			Algo:    algo,
			Graph:   c.graph,
			InPlace: inPlace,
			Iters:   c.iters,
			Warmup:  c.warmup,
			Check:   c.check,
		})
		if err != nil {
			return got, fmt.Errorf("%s: %w", name, err)
		}
		if !c.check {
			got.Wrong, got.First = 0, nil
		}
		if got.Wrong > 0 && got.First != nil && r.First == nil {
			r.First = &located{Algo: algo, Bytes: bytes, InPlace: inPlace, Mismatch: *got.First}
		}
		if backend == backendNCCL {
			ncclDone[k] = got
		}
		return got, nil
	}
	first := backendGoccl
	if c.backend == backendNCCL {
		first = backendNCCL
	}
	for _, algo := range c.algos {
		r.Blocks = append(r.Blocks, block{Algo: algo, Backend: c.backend, Rows: []row{}})
		b := &r.Blocks[len(r.Blocks)-1]
		for _, bytes := range sizes {
			var m [2]Measurement
			for i, inPlace := range []bool{false, true} {
				var err error
				if m[i], err = measure(first, algo, bytes, inPlace); err != nil {
					return err
				}
			}
			var nccl *[2]Measurement
			if c.backend == backendBoth {
				nccl = new([2]Measurement)
				for i, inPlace := range []bool{false, true} {
					var err error
					if nccl[i], err = measure(backendNCCL, backendNCCL, bytes, inPlace); err != nil {
						return err
					}
				}
			}
			b.Rows = append(b.Rows, newRow(bytes, c.dtype, world, m[0], m[1], nccl))
		}
	}
	return nil
}
