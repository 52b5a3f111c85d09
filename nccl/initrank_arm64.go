package nccl

import "unsafe"

// initRank calls ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int
// rank), or ncclCommInitRankConfig with the extra ncclConfig_t* config when cfg is not nil,
// whose commId is a 128-byte struct passed BY VALUE.
//
// AAPCS64 passes a composite larger than 16 bytes by reference: the caller makes a copy and
// passes its address in the next integer register. So the call is comm (X0), nranks (X1), the
// address of a copy of the id (X2), rank (X3), config (X4). The callee may write to the copy,
// hence a private one.
func (l *library) initRank(comm *uintptr, nranks, rank int, id *UniqueID, cfg *config) Result {
	tmp := *id
	if cfg == nil {
		return raw(l.commInitRank, uintptr(unsafe.Pointer(comm)), uintptr(int32(nranks)),
			uintptr(unsafe.Pointer(&tmp)), uintptr(int32(rank)))
	}
	return raw(l.commInitRankConfig, uintptr(unsafe.Pointer(comm)), uintptr(int32(nranks)),
		uintptr(unsafe.Pointer(&tmp)), uintptr(int32(rank)), uintptr(unsafe.Pointer(cfg)))
}
