#!/usr/bin/env bash
# The library's objects compiled for AVX-512 (kernels/cpu/x86) define no global or weak symbol that
# another of its objects also defines. Such a symbol is an inline function or template instance
# compiled once for AVX-512 and once for any x86-64; the linker keeps one copy for every caller,
# and where it keeps the AVX-512 one, a CPU without AVX-512 dies of SIGILL in unrelated code.
# usage: x86_objects_isolated.sh NM 'OBJECT;OBJECT;...'   (CMake's list of the library's objects)
set -euo pipefail
nm=$1
IFS=';' read -r -a objects <<< "$2"
x86=() others=()
for o in "${objects[@]}"; do
  case $o in
    *.gch | *.pch) ;;  # a precompiled header the list may carry
    */kernels/cpu/x86/*) x86+=("$o") ;;
    *) others+=("$o") ;;
  esac
done
if [ ${#x86[@]} -eq 0 ] || [ ${#others[@]} -eq 0 ]; then
  echo "expected objects of kernels/cpu/x86 and others among: $2" >&2
  exit 1
fi

# What another object can bind to: defined global symbols (upper case, U aside) and GNU unique (u).
exported() { "$nm" --defined-only -P "$@" | awk 'NF >= 2 && ($2 ~ /^[A-TV-Z]$/ || $2 == "u") { print $1 }' | sort -u; }
x86_symbols=$(exported "${x86[@]}")
other_symbols=$(exported "${others[@]}")
shared=$(comm -12 <(echo "$x86_symbols") <(echo "$other_symbols"))
echo "${#x86[@]} AVX-512 objects against ${#others[@]} others; the AVX-512 objects export:"
echo "$x86_symbols" | sed 's/^/  /'
if [ -n "$shared" ]; then
  echo "FAILED: also defined by another object of the library (give them internal linkage):" >&2
  echo "$shared" | { command -v c++filt > /dev/null && c++filt || cat; } | sed 's/^/  /' >&2
  exit 1
fi
