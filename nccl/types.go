package nccl

import (
	"fmt"
	"math"
	"strconv"
	"unsafe"
)

// UniqueID is an ncclUniqueId: the 128 bytes that rank 0 gets from GetUniqueID and every rank
// passes to InitRank. It carries the address of the bootstrap root (a thread that
// GetUniqueID starts in the calling process, which must stay alive until every rank has
// joined); send it to the other ranks through any channel. It is plain data, safe to copy.
type UniqueID [128]byte

// DataType is an ncclDataType_t, the element type of a collective.
type DataType int32

// The ncclDataType_t values (nccl.h).
const (
	Int8     DataType = 0 // ncclInt8
	Uint8    DataType = 1 // ncclUint8
	Int32    DataType = 2 // ncclInt32
	Uint32   DataType = 3 // ncclUint32
	Int64    DataType = 4 // ncclInt64
	Uint64   DataType = 5 // ncclUint64
	Float16  DataType = 6 // ncclFloat16 (IEEE half)
	Float32  DataType = 7 // ncclFloat32
	Float64  DataType = 8 // ncclFloat64
	BFloat16 DataType = 9 // ncclBfloat16
)

var dataTypes = [...]struct {
	name string
	size uint64
}{
	{"ncclInt8", 1}, {"ncclUint8", 1}, {"ncclInt32", 4}, {"ncclUint32", 4}, {"ncclInt64", 8},
	{"ncclUint64", 8}, {"ncclFloat16", 2}, {"ncclFloat32", 4}, {"ncclFloat64", 8}, {"ncclBfloat16", 2},
}

// String returns the ncclDataType_t name of t.
func (t DataType) String() string {
	if t >= 0 && int(t) < len(dataTypes) {
		return dataTypes[t].name
	}
	return "ncclDataType_t(" + strconv.Itoa(int(t)) + ")"
}

// Size returns the size of one element of t in bytes, or 0 for a type this package does not know.
func (t DataType) Size() uint64 {
	if t >= 0 && int(t) < len(dataTypes) {
		return dataTypes[t].size
	}
	return 0
}

// RedOp is an ncclRedOp_t, the reduction of a collective.
type RedOp int32

// The built-in ncclRedOp_t values (nccl.h).
const (
	Sum  RedOp = 0 // ncclSum
	Prod RedOp = 1 // ncclProd
	Max  RedOp = 2 // ncclMax
	Min  RedOp = 3 // ncclMin
	Avg  RedOp = 4 // ncclAvg: the sum divided by the number of ranks
)

var redOpNames = [...]string{"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"}

// String returns the ncclRedOp_t name of op.
func (op RedOp) String() string {
	if op >= 0 && int(op) < len(redOpNames) {
		return redOpNames[op]
	}
	return "ncclRedOp_t(" + strconv.Itoa(int(op)) + ")"
}

// Version is an NCCL release, e.g. 2.21.5.
type Version struct {
	Major, Minor, Patch int
}

// MinVersion is the oldest NCCL this package loads: the first whose ncclConfig_t has the
// layout this package writes (splitShare), and whose non-blocking init and abort work as
// documented.
var MinVersion = Version{2, 18, 0}

// versionFromCode decodes ncclGetVersion's number. NCCL_VERSION(X, Y, Z) is X*1000 + Y*100 + Z
// up to 2.8 and X*10000 + Y*100 + Z from 2.9 on (21803 is 2.18.3).
func versionFromCode(code int) Version {
	if code < 10000 {
		return Version{code / 1000, code % 1000 / 100, code % 100}
	}
	return Version{code / 10000, code % 10000 / 100, code % 100}
}

// code returns NCCL_VERSION(v.Major, v.Minor, v.Patch).
func (v Version) code() int {
	if v.Major <= 2 && v.Minor <= 8 {
		return v.Major*1000 + v.Minor*100 + v.Patch
	}
	return v.Major*10000 + v.Minor*100 + v.Patch
}

// Less reports whether v is an older release than w.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

// String returns "2.21.5".
func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
}

// config is ncclConfig_t exactly as nccl.h 2.18 declares it (ncclConfig_v21700 with
// splitShare): NCCL copies min(size, its own sizeof) bytes over its defaults and ignores the
// fields that the version field says the caller cannot know, so a newer libnccl reads this
// struct correctly and keeps its defaults for everything after it.
type config struct {
	size           uint64 // size_t size: sizeof this struct
	magic          uint32 // unsigned int magic: configMagic
	version        uint32 // unsigned int version: NCCL_VERSION of the header this layout is from
	blocking       int32  // int blocking
	cgaClusterSize int32  // int cgaClusterSize
	minCTAs        int32  // int minCTAs
	maxCTAs        int32  // int maxCTAs
	netName        uintptr
	splitShare     int32 // int splitShare
	// tail is the padding after splitShare in 2.18's struct. NCCL 2.19 to 2.24 put
	// trafficClass there and read it whatever the version field says, so it is set to
	// "undefined" rather than left 0 (a traffic class of 0).
	tail int32
}

const (
	configMagic = 0xcafebeef
	// configUndef is NCCL_CONFIG_UNDEF_INT: NCCL chooses (or takes its environment variable).
	configUndef = math.MinInt32
)

// newConfig returns what NCCL_CONFIG_INITIALIZER gives in a program built against nccl.h 2.18:
// every field undefined.
func newConfig() config {
	return config{
		size: uint64(unsafe.Sizeof(config{})), magic: configMagic, version: uint32(MinVersion.code()),
		blocking: configUndef, cgaClusterSize: configUndef, minCTAs: configUndef, maxCTAs: configUndef,
		splitShare: configUndef, tail: configUndef,
	}
}
