//go:build goccl_nvml_cgo && !cgo

package topology

// The goccl_nvml_cgo tag selects go-nvml, which is cgo: without cgo the build stops here,
// on an undefined name that says what to do, rather than on go-nvml's own missing symbols.
// Build with CGO_ENABLED=1 (and a C compiler), or drop the tag for the purego binding.
var _ = goccl_nvml_cgo_tag_needs_CGO_ENABLED_1
