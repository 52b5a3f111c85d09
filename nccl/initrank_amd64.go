package nccl

import (
	"encoding/binary"
	"unsafe"
)

// initRank calls ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int
// rank), or ncclCommInitRankConfig with the extra ncclConfig_t* config when cfg is not nil,
// whose commId is a 128-byte struct passed BY VALUE.
//
// The x86-64 System V ABI classifies a struct larger than 16 bytes as MEMORY: it takes no
// register; the caller copies it onto the stack, in argument order, where the callee finds it
// at the first stack argument slot. The integer arguments around it still take the integer
// registers in order: comm in RDI, nranks in RSI, rank in RDX (not a stack slot: the struct
// used no register) and config in RCX. purego.SyscallN puts its arguments 1..6 in RDI, RSI,
// RDX, RCX, R8, R9 and 7.. in consecutive stack slots, so the call is: comm, nranks, rank,
// config (0 for ncclCommInitRank, which never reads RCX), two unused register slots, then the
// id's sixteen words as stack slots 7..22.
func (l *library) initRank(comm *uintptr, nranks, rank int, id *UniqueID, cfg *config) Result {
	var w [16]uintptr
	for i := range w {
		w[i] = uintptr(binary.LittleEndian.Uint64(id[8*i:]))
	}
	fn := l.commInitRank
	if cfg != nil {
		fn = l.commInitRankConfig
	}
	return raw(fn, uintptr(unsafe.Pointer(comm)), uintptr(int32(nranks)), uintptr(int32(rank)),
		uintptr(unsafe.Pointer(cfg)), 0, 0,
		w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7],
		w[8], w[9], w[10], w[11], w[12], w[13], w[14], w[15])
}
