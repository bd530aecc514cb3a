#!/usr/bin/env bash
# The installed libdepot_client.so: its SONAME, and a dynamic symbol table
# that holds the public API only (docs/packaging.md): the C functions that
# depot.h declares, and C++ names directly in namespace depot (classes and
# functions are CamelCase there; internal namespaces such as depot::v1 and
# depot::wire are lower case), with the vtables and type information of the
# exported classes. Prints the count.
# Usage: check_library.sh PREFIX LIBDIR VERSION
set -euo pipefail
prefix=$1 libdir=$2 version=$3
lib=${prefix}/${libdir}/libdepot_client.so.${version}
soname_expected=libdepot_client.so.${version%%.*}

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

soname=$(readelf -d "${lib}" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[[ ${soname} == "${soname_expected}" ]] ||
  fail "SONAME is '${soname}', expected ${soname_expected}"
if readelf -d "${lib}" | grep -E '\((RPATH|RUNPATH)\)'; then
  fail "the installed library keeps a run path"
fi

mapfile -t symbols < <(nm -D --defined-only --just-symbols "${lib}" | c++filt)
public_cxx='^((typeinfo|typeinfo name|vtable) for )?depot::[A-Z]'
unexpected=()
c_exported=()
for symbol in "${symbols[@]}"; do
  if [[ ${symbol} =~ ^depot_[a-z0-9_]+$ ]]; then
    c_exported+=("${symbol}")
  elif [[ ! ${symbol} =~ ${public_cxx} ]]; then
    unexpected+=("${symbol}")
  fi
done
if ((${#unexpected[@]} > 0)); then
  fail "${#unexpected[@]} exported symbol(s) outside the public API:"
  printf '  %s\n' "${unexpected[@]:0:40}" >&2
fi

# The C functions exported are exactly those depot.h declares (a declaration
# without DEPOT_API shows up as missing).
declared=$(sed -n -E \
  's/^(DEPOT_API )?(const )?[a-z0-9_]+[ *]+(depot_[a-z0-9_]+)\(.*/\3/p' \
  "${prefix}/include/depot/depot.h" | sort)
exported=$(printf '%s\n' "${c_exported[@]}" | sort)
if [[ ${declared} != "${exported}" ]]; then
  fail "the C functions exported differ from those depot.h declares:"
  diff <(echo "${declared}") <(echo "${exported}") >&2 || true
fi

# A few C++ entry points a trainer cannot do without.
all_symbols=$(printf '%s\n' "${symbols[@]}")
for required in 'depot::Client::Connect(' 'depot::ValidateJobConfig(' \
                'depot::MakeJobGeometry(' 'depot::Fingerprint(' \
                'depot::Layout::Create(' 'depot::MakeGradScaler(' \
                'depot::OptimizerParamScheduler::Create(' \
                'typeinfo for depot::Job'; do
  grep -qF -- "${required}" <<<"${all_symbols}" ||
    fail "${required} is not exported"
done

echo "${lib}: SONAME ${soname}, ${#symbols[@]} exported symbols" \
     "(${#c_exported[@]} C functions, $((${#symbols[@]} - ${#c_exported[@]})) C++)"
if ((failures > 0)); then
  exit 1
fi
