#!/usr/bin/env bash
# Fetches the NVIDIA user-space pieces that the CPU tests need, from Debian's non-free section,
# without installing them system-wide: apt-get download + dpkg -x into .tools/.
#
#   .tools/libcuda/libcuda.so.1        real libcuda of driver 535 (no GPU here: cuInit -> 100)
#   .tools/nvml/libnvidia-ml.so.1      real NVML (no GPU here: nvmlInit fails cleanly)
#   .tools/cuda/bin/ptxas              ptxas of CUDA 11.8 (PTX ISA 7.8, sm_80 and sm_90)
#
# Usage: scripts/fetch-tools.sh [libcuda] [nvml] [ptxas]   (no argument: all three)
# Prints the environment to export (GOCCL_LIBCUDA, GOCCL_LIBNVML, GOCCL_PTXAS) on stdout.
# It uses its own apt source list and state folder under .tools/apt, so the machine's apt
# configuration is left alone; it needs network access to Debian's mirror. Runs at the same
# time take turns (a lock on .tools/.lock): they share that state folder.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/.tools"
apt_dir="$tools/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
exec 9>"$tools/.lock"
flock 9

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(libcuda nvml ptxas)

apt_opts=(
  -o "Dir::Etc::SourceList=$apt_dir/sources.list"
  -o "Dir::Etc::SourceParts=-"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache"
  -o "APT::Architecture=amd64"
  -o "Debug::NoLocking=1"
  -o "APT::Sandbox::User=root"
)

apt_ready=
apt_update() {
  [ -n "$apt_ready" ] && return 0
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main contrib non-free non-free-firmware" >"$apt_dir/sources.list"
  apt-get "${apt_opts[@]}" -qq update >&2
  apt_ready=1
}

# extract PKG...: downloads the packages and unpacks them into .tools/root.
extract() {
  apt_update
  (cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" -qq download "$@" >&2)
  for p in "$@"; do
    for f in "$apt_dir/debs/${p}"_*.deb; do dpkg -x "$f" "$tools/root"; done
  done
}

# first FILE-PATTERN: the first file under .tools/root matching the pattern.
first() { find "$tools/root" -path "$1" \( -type f -o -type l \) 2>/dev/null | sort | head -n 1; }

# is_elf FILE: FILE is an ELF file (a library or an executable), not an empty or cut one.
is_elf() { [ -s "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }

# install SRC DST: copies SRC to DST through a temporary file, so that an interrupted copy
# never leaves a DST that a later run would take for a fetched tool.
install_tool() {
  mkdir -p "$(dirname "$2")"
  cp -L "$1" "$2.tmp.$$"
  is_elf "$2.tmp.$$" || { rm -f "$2.tmp.$$"; echo "fetch-tools: $1 is not an ELF file" >&2; exit 1; }
  mv -f "$2.tmp.$$" "$2"
}

# export NAME PATH: the line that exports NAME=PATH, quoted for the shell.
export_line() { printf 'export %s=%q\n' "$1" "$2"; }

for w in "${want[@]}"; do
  case "$w" in
  libcuda)
    if ! is_elf "$tools/libcuda/libcuda.so.1"; then
      extract libcuda1
      lib=$(first '*/libcuda.so.1')
      [ -n "$lib" ] || { echo "fetch-tools: libcuda.so.1 not found in libcuda1" >&2; exit 1; }
      install_tool "$lib" "$tools/libcuda/libcuda.so.1"
    fi
    export_line GOCCL_LIBCUDA "$tools/libcuda/libcuda.so.1"
    ;;
  nvml)
    if ! is_elf "$tools/nvml/libnvidia-ml.so.1"; then
      extract libnvidia-ml1
      lib=$(first '*/libnvidia-ml.so.1')
      [ -n "$lib" ] || { echo "fetch-tools: libnvidia-ml.so.1 not found in libnvidia-ml1" >&2; exit 1; }
      install_tool "$lib" "$tools/nvml/libnvidia-ml.so.1"
    fi
    export_line GOCCL_LIBNVML "$tools/nvml/libnvidia-ml.so.1"
    ;;
  ptxas)
    if ! [ -x "$tools/cuda/bin/ptxas" ] || ! is_elf "$tools/cuda/bin/ptxas"; then
      extract nvidia-cuda-toolkit
      bin=$(first '*/bin/ptxas')
      [ -n "$bin" ] || { echo "fetch-tools: ptxas not found in nvidia-cuda-toolkit" >&2; exit 1; }
      install_tool "$bin" "$tools/cuda/bin/ptxas"
      chmod +x "$tools/cuda/bin/ptxas"
    fi
    export_line GOCCL_PTXAS "$tools/cuda/bin/ptxas"
    ;;
  *) echo "fetch-tools: unknown tool $w (want libcuda, nvml or ptxas)" >&2; exit 2 ;;
  esac
done
