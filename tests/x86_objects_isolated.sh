#!/usr/bin/env bash
# The library's objects compiled for a vector extension (kernels/cpu/x86: *_avx512 for AVX-512,
# *_avx2 for AVX2) define no global or weak symbol that another of its objects also defines, the
# objects of the other extension included. Such a symbol is an inline function or template instance
# compiled once for the extension and once for any x86-64 (or for the other extension); the linker
# keeps one copy for every caller, and where it keeps the vector one, a CPU without that extension
# dies of SIGILL in unrelated code.
# usage: x86_objects_isolated.sh NM 'OBJECT;OBJECT;...'   (CMake's list of the library's objects)
set -euo pipefail
nm=$1
IFS=';' read -r -a objects <<< "$2"
avx512=() avx2=() others=()
for o in "${objects[@]}"; do
  case $o in
    *.gch | *.pch) ;;  # a precompiled header the list may carry
    */kernels/cpu/x86/*avx512*) avx512+=("$o") ;;
    */kernels/cpu/x86/*avx2*) avx2+=("$o") ;;
    */kernels/cpu/x86/*)
      echo "an object of kernels/cpu/x86 that is neither *avx512* nor *avx2*: $o" >&2
      exit 1
      ;;
    *) others+=("$o") ;;
  esac
done
if [ $((${#avx512[@]} + ${#avx2[@]})) -eq 0 ] || [ ${#others[@]} -eq 0 ]; then
  echo "expected objects of kernels/cpu/x86 and others among: $2" >&2
  exit 1
fi

# What another object can bind to: defined global symbols (upper case, U aside) and GNU unique (u).
# DW.ref.__gxx_personality_v0 is not code: it is the hidden weak pointer to the C++ exception
# personality routine that every object with an unwind landing pad carries (the sanitizers' -O1
# keeps such pads in the vector objects), the same data in every copy whatever the target.
exported() {
  "$nm" --defined-only -P "$@" |
    awk 'NF >= 2 && ($2 ~ /^[A-TV-Z]$/ || $2 == "u") && $1 !~ /^DW\.ref\./ { print $1 }' | sort -u
}
failed=0
# check NAME OBJECTS... -- OTHER OBJECTS...: the first group's exports against the second's.
check() {
  local name=$1 group=() rest=()
  shift
  while [ "$1" != "--" ]; do group+=("$1"); shift; done
  shift
  rest=("$@")
  [ ${#group[@]} -eq 0 ] && return 0
  local mine theirs shared
  mine=$(exported "${group[@]}")
  theirs=$(exported "${rest[@]}")
  shared=$(comm -12 <(echo "$mine") <(echo "$theirs"))
  echo "${#group[@]} $name objects against ${#rest[@]} others; the $name objects export:"
  echo "$mine" | sed 's/^/  /'
  if [ -n "$shared" ]; then
    echo "FAILED: $name symbols also defined by another object of the library (give them internal linkage):" >&2
    echo "$shared" | { command -v c++filt > /dev/null && c++filt || cat; } | sed 's/^/  /' >&2
    failed=1
  fi
}
check AVX-512 "${avx512[@]}" -- "${others[@]}" "${avx2[@]}"
check AVX2 "${avx2[@]}" -- "${others[@]}" "${avx512[@]}"
exit $failed
