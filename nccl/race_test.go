//go:build race

package nccl

// raceEnabled: the race detector makes sync.Pool (here and in purego) drop items at random,
// so allocation counts mean nothing under it.
const raceEnabled = true
