package main

import (
	"context"
	"fmt"
)

// sweep measures every algorithm of c at every size, out of place then in
// place, and adds the rows to r. It stops at the first error, which names
// the case; rows of sizes not fully measured are left out.
func sweep(ctx context.Context, eng engine, c config, world int, r *report, prog *progress) error {
	sizes := c.sizes()
	prog.start(2 * len(sizes) * len(c.algos))
	defer prog.clear()
	for _, algo := range c.algos {
		r.Blocks = append(r.Blocks, block{Algo: algo, Rows: []row{}})
		b := &r.Blocks[len(r.Blocks)-1]
		for _, bytes := range sizes {
			var m [2]Measurement
			for i, inPlace := range []bool{false, true} {
				name := fmt.Sprintf("%s, %d B %s", algo, bytes, placement(inPlace))
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("interrupted before %s: %w", name, err)
				}
				prog.step(name)
				got, err := eng.Run(ctx, Case{
					Bytes:   bytes,
					DType:   c.dtype,
					Algo:    algo,
					Graph:   c.graph,
					InPlace: inPlace,
					Iters:   c.iters,
					Warmup:  c.warmup,
					Check:   c.check,
				})
				if err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				if !c.check {
					got.Wrong, got.First = 0, nil
				}
				if got.Wrong > 0 && got.First != nil && r.First == nil {
					r.First = &located{Algo: algo, Bytes: bytes, InPlace: inPlace, Mismatch: *got.First}
				}
				m[i] = got
			}
			b.Rows = append(b.Rows, newRow(bytes, c.dtype, world, m[0], m[1]))
		}
	}
	return nil
}
