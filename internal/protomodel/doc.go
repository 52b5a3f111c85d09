// Package protomodel checks the synchronisation protocols of goccl's
// all-reduce kernels by running them as Go goroutines over atomic memory under
// randomised scheduling. It models the protocols of docs/kernel-abi.md, not
// the PTX text: a change to either must be reflected in the other.
//
// # What is modelled
//
// Memory. Every rank's 16 KiB signal region is an array of u32 words at the
// offsets of docs/kernel-abi.md (self_counter, peer_counter[2 phases],
// push_epoch, push_pending, call), zeroed at creation; push receive buffers and
// one-shot input buffers are arrays of u32 elements. Every access is one
// sync/atomic load or store, the counterpart of one ld/st in the kernel.
//
// Blocks and threads. Each block of each rank is a goroutine. A block's
// threads are state machines that the goroutine steps in a random order, one
// memory operation per step, so that they interleave as freely as
// independently scheduled GPU threads; a block-wide bar.sync is the point
// where the goroutine has finished every thread's steps. Calls on one rank are
// stream-ordered: call k+1's blocks start after all of call k's have returned.
// Random yields, short sleeps and occasional millisecond stalls after each step
// let one rank run a whole round ahead while another stalls.
//
// Barrier (Barrier; steps (2) to (6) of docs/kernel-abi.md's barrier). Lane t < ws of
// block b increments self_counter[b][t] (2), stores it to rank t's
// peer_counter[val&1][b][rank] (3, st.volatile or st.release.sys), and spins
// until its own peer_counter[val&1][b][t] equals it (ld.volatile or
// ld.acquire.sys, compared with != as a u32, so wrapping is harmless). The run
// checks, at every pass of barrier k, that every rank's same block had arrived
// at k, and it starts the counters just below 2^32 so that they wrap. The
// broken variants OnePhase (one slot: a rank one barrier ahead overwrites a
// round its peer has not read, a deadlock) and GreaterOrEqual (>= instead of
// !=: passes early once the counter wraps) must be caught. Counting is the
// barrier of the GPU-scope kernels (every rank on one GPU): lane t first adds
// 1 to rank t's peer_counter[0][b][rank] (red.add: the number of this rank's
// arrivals), then increments self_counter[b][t] to val and spins while its own
// peer_counter[0][b][t] is val-1 (rank t may already be at val+1). Its broken
// variant CountingEqual (spin until the slot equals val) misses a peer one
// barrier ahead and must be caught deadlocking.
//
// Call check (BarrierConfig.Calls; one-shot and two-shot). Barriers pair up into
// calls. Block 0 alone checks (the other blocks only pass their barriers). At a
// call's entry barrier its lane 0 publishes the rank's call fingerprint
// into call as ptx.CallWords tagged with its round: four word stores that
// stay pending and land one by one at random later steps of the block, so peers
// may see none, some or all of them after the block's arrival (no fence orders
// them). After the barrier lane t loads rank t's words one by one; before its
// next arrival it tests them against its own call tagged with its round: equal
// passes, another tag in any word loads again, the same tags with other bits is
// a mismatch. Calls change from one call to the next, and Mismatches makes one
// rank differ in chosen calls. The run fails with ErrFalseMismatch for any
// report of equal calls and ErrMissedMismatch unless every pair of differing
// ranks reported each other in block 0; Stats.Unpublished counts checks
// that met a call not yet visible. The broken variants CallUntagged (words
// without the round: a peer's previous call counts as its call) and CallLate
// (loaded and tested after the next arrival: the peer may have published its
// next call) must be caught by a false mismatch and a deadlock.
//
// Push (Push). Receive buffer of rank r: [P parts][ws sources][n]; all-zero
// bits mean "not arrived". Block b reads push_epoch[b] = t and uses part t;
// each thread sends its grid-stride elements to slot (t, rank) of every rank
// with +0.0 sent as -0.0 (st.volatile.global.v4.b32), then for each element
// polls slots (t, 0..ws-1) in order until non-zero (ld.volatile.global.v4.b32)
// and adds in float32. Immediate (P = 2) re-arms the slots with zeros right
// after reading them. Deferred (P = 3) leaves the re-arm of a call in which
// every thread has at most one element to the next call, which zeroes part
// t-1 after its sends, at the indices push_pending recorded. After the block
// is done, push_epoch[b] = t+1 mod P. Each call draws its element count and
// block size (the grid stays) and fresh random data, and every sum is
// compared bitwise to internal/ref.Push. The broken variants OneHalf (no
// alternation) and DeferredTwoParts (deferral with two parts) must be caught
// by a wrong sum or a deadlock. Call headers (PushConfig.Headers): lane s of
// block 0 sends the call to header[0] of slot (t, rank) of rank s after its
// sends, and after its receives waits for rank s's header, compares it with
// its own call and zeroes it, in the same call also where the data's re-arm is
// deferred; Mismatches makes one rank send another call (same shape). Reports
// (block 0's) must be exactly the differing pairs (ErrFalseMismatch,
// ErrMissedMismatch); the broken HeadersNotRearmed must be caught by a false
// mismatch. Fused push calls (PushConfig.Fused) send the same way but receive
// row by row, a row's elements taken by one block or spread over several, never
// defer their re-arm and do the one a plain call before them deferred;
// interleaved with plain calls, every sum must still be right.
//
// One-shot exit barrier and staging (OneShot). Between calls the buffer a rank's
// peers read is overwritten by the next call's staging, which only waits for the
// rank's own previous kernel: a copy before the kernel (HostCopy), or the kernel's
// own (KernelStaged, ptx.FlagStageInput). With the exit barrier no block ever
// reads another call's data; without it a stale read must be caught. The kernel's
// staging is modelled as weak stores: each thread of block b queues stores of the
// elements it reduces later, which stay pending and land one by one at random
// later steps of the block, so they may reach memory after the block's arrival;
// the block reads its own pending stores (program order). The copy's bar.sync and
// each lane's fence before (3) land all of the block's pending stores (release);
// the block's reads come after its barrier (the lanes' acquiring polls and
// bar.red). Stats.Released counts the stores still pending at a fence. Broken
// variants, each of which must be caught reading another call's data:
// StagedNoRelease (no fence), StagedNoBarSync (lane t's fence lands only thread
// t's stores), StagedNoAcquire (about half of the reads of peers performed before
// the barrier), StagedAfterBarrier (the copy after the entry barrier) and
// StagedOtherBlock (block b copies block b+1's elements). SplitExit runs the exit
// barrier in two halves, as the fused one-shot's row-cache build does: every lane
// tells its peer right after the block's reads, the block works on (its norm pass:
// pauses), then the lanes poll; no call may write its input while a peer still
// reads. Its broken variant SplitEarly arrives before the block's last reads and
// must be caught reading another call's data. Regions (OneShotConfig.Regions, with
// the kernel's staging and no exit barrier) is what a one-shot needs to drop its
// exit barrier, which the kernels keep: BlockParity stages block b's elements, in
// the order the block visits them, into a region of block b's own, in the half
// that the parity of the block's entry round picks; VaryGrid gives every call its
// own grid, so the blocks' rounds drift apart. No block may read another call's
// data while calls stage ahead of slow peers (Stats.Ahead); the broken layouts
// BlockRegionsOnly (one half) and ElemParity (halves indexed by element, with
// VaryGrid) must be caught reading another call's data. The call check then
// needs halves too (BarrierConfig.Calls = CallHalves: every barrier a call's
// entry, the words in the set the round's parity picks); with one set
// (CallOneSet) a peer's next call lands over the one a lane has not loaded yet
// and must be caught.
//
// Residency (Residency). The runs above assume every block runs; with ranks
// sharing a GPU that needs every block they wait for to be resident, and PDL
// lets a rank's next kernel hold slots while it waits for the previous one.
// This model is a state machine rather than goroutines: slots, each rank's
// queued calls, kernel launch (at the predecessor's exit without PDL; with
// PDL once its every block triggered, early or past its last wait on peers) and
// each block's way through griddepcontrol.wait, its waits on peers and its
// exit, with a random enabled step at a time. Each call is of a kind: SendFirst
// (push with its early flag) triggers early before any wait on a peer;
// EntryFirst (one-shot, direct two-shot, the fused kernels, and push without the
// flag, whose first receive is its entry barrier) after its entry barrier, then
// waits on its peers again at its exit barrier; an EntryFirst call's last blocks
// may be idle (no data: they wait for no peer and trigger only by exiting).
// ptx.EarlyTriggerRoom's rule must never deadlock, nor EarlyAfterEntry (every
// EntryFirst grid early, SendFirst ones within the room), nor EarlyAlways with
// every call EntryFirst, idle blocks or not; EarlyAlways with SendFirst calls,
// and a room one block larger than the rule's, must.
//
// Failures are errors: ErrEarlyPass, ErrWrongSum, ErrStaleRead, and a
// *DeadlockError (errors.Is ErrDeadlock) from a progress watchdog that stops a
// run when nothing progressed for the stall time, listing every spin loop that
// was waiting and the value its slot held. Stats say how often a block really
// overtook a peer, so that tests need not trust the scheduler to have tried.
//
// # What is not modelled
//
// Go's atomics are sequentially consistent; the GPU's memory model is not.
// Apart from the one-shot staging's weak stores and early reads above, the model
// says nothing about the ordering the PTX must establish on top of
// the protocol: that data written before the kernel is visible to peers
// (volatile flags suffice because a kernel boundary orders it), that data
// written by the same kernel reaches a peer before the flag (st.release.sys /
// ld.acquire.sys, system scope across GPUs), that bar.sync carries those
// orders to the whole block, and that 16-byte vector stores may land in parts
// (the push model polls per element, which covers the protocol but not the
// hardware). Nor that a one-shot block's reads of its peers' inputs are complete
// before its exit barrier tells them it is done (the model's loads are atomic;
// the kernel's loaded values feed the stores that its exit barrier's bar.sync
// waits for). Also outside the model: the watchdog timeout path and error
// record, the two-shot middle barrier and tmp-buffer reuse, a block count
// that changes between push calls, push calls whose counts differ between
// ranks (a receiver then waits for data that never comes, and its lanes watch
// the headers while waiting), mismatched pull calls whose grids differ (blocks
// without a partner time out), and the tail store (p_tail), which changes no
// protocol. Forward progress is only in Residency,
// which counts slots in blocks of the largest size (ThreadsPerBlock), as
// collective's caps do; the block scheduler's real packing of smaller blocks
// is not modelled.
package protomodel
