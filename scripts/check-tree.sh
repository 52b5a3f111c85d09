#!/usr/bin/env bash
# Fails when the repository tracks something that is not source: a binary (an ELF or Mach-O
# executable, or any file holding a NUL byte), a file over 1 MiB, or a file that
# .gitignore ignores (a build output added by force or before its pattern existed). It checks
# the index, which is what a commit records, so a staged deletion counts as gone.
#
#   scripts/check-tree.sh [DIR]     DIR: a folder inside the work tree to check (default: this
#                                   repository)
#
# make test runs it first (and so does .ci/run). Text test data, such as Go fuzz corpora
# ("go test fuzz v1" files) and golden outputs, passes.
set -euo pipefail

dir=${1:-"$(dirname "$0")/.."}
cd "$dir"
cd "$(git rev-parse --show-toplevel)"

limit=$((1 << 20))
bad=0
fail() { # path reason
  echo "check-tree: $1: $2" >&2
  bad=1
}

# kind BLOB: "an ELF" or "a Mach-O" for an executable's magic number, else nothing. Other binaries
# (PE, archives, images) hold NUL bytes, which the caller checks next.
kind() {
  local magic
  magic=$(git cat-file blob "$1" | head -c 4 | od -An -tx1 | tr -d ' \n')
  case $magic in
  7f454c46) echo "an ELF" ;;
  feedface | feedfacf | cefaedfe | cffaedfe | cafebabe) echo "a Mach-O" ;;
  esac
}

# Each index entry: "MODE OBJECT STAGE<TAB>PATH", NUL-terminated so any file name is safe.
while IFS= read -r -d '' entry; do
  meta=${entry%%$'\t'*}
  path=${entry#*$'\t'}
  read -r mode obj _ <<<"$meta"
  case $mode in
  120000 | 160000) continue ;; # a symbolic link or a submodule: no content of its own here
  esac
  size=$(git cat-file -s "$obj")
  if [ "$size" -gt "$limit" ]; then
    fail "$path" "$size bytes, over the 1 MiB limit for tracked files (keep large data out of git: fetch or generate it, and ignore it in .gitignore)"
  fi
  k=$(kind "$obj")
  if [ -n "$k" ]; then
    fail "$path" "$k executable (build outputs are never committed: git rm --cached '$path' and ignore it in .gitignore)"
  elif [ "$(git cat-file blob "$obj" | tr -dc '\000' | head -c 1 | wc -c)" -ne 0 ]; then
    fail "$path" "binary content (a NUL byte); only text is tracked (git rm --cached '$path'; keep binaries out of git or generate them in the test)"
  fi
done < <(git ls-files -s -z)

# Tracked files that .gitignore would ignore: added with --force or before the pattern.
while IFS= read -r -d '' path; do
  fail "$path" "tracked, but .gitignore ignores it (a build output? git rm --cached '$path')"
done < <(git ls-files -z -c -i --exclude-standard)

if [ $bad -ne 0 ]; then
  echo "check-tree: the tree holds files that must not be committed (see above)" >&2
  exit 1
fi
