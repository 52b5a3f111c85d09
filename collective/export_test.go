package collective

// SetEarlyTrigger sets which of c's launches let their dependents launch before their last
// wait on a peer (ptx.FlagEarlyTrigger): the grids of at most room blocks, and with anyGrid
// every grid of the kernels that trigger after their entry barrier (ptx.EarlyTriggerAnyGrid).
// For benchmarks that measure the rule, in harnesses where every kernel of a call is resident
// before any rank's next kernel launches: anywhere else a room past ptx.EarlyTriggerRoom's
// may deadlock ranks that share a GPU. Call it before the communicator's first call.
func SetEarlyTrigger(c *Comm, room int, anyGrid bool) { c.earlyRoom, c.earlyAnyGrid = room, anyGrid }

// EarlyRoom is c's room for ptx.FlagEarlyTrigger (ptx.EarlyTriggerRoom).
func EarlyRoom(c *Comm) int { return c.earlyRoom }

// SetEntryTrigger sets whether c's early triggers of the kernels with an entry barrier come
// right after it (ptx.FlagEntryTrigger) or before their last wait on a peer. Both places are
// safe wherever the early trigger is; benchmarks compare them. Call it before the
// communicator's first call.
func SetEntryTrigger(c *Comm, entry bool) { c.entryTrigger = entry }
