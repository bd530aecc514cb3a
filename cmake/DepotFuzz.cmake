# DEPOT_FUZZ: build the libFuzzer targets of tests/fuzz (docs/fuzzing.md).
# Needs clang: every target of the build, the libraries under test included,
# is compiled with AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's
# coverage instrumentation, and the fuzz targets are linked with libFuzzer.
# (Debian's protobuf, gRPC and abseil, built by g++, are linked as they are:
# same libstdc++, not instrumented.) Without DEPOT_FUZZ the fuzz targets are
# still built, with any compiler, as replay programs that CI runs.
option(DEPOT_FUZZ "Build the libFuzzer fuzz targets (clang only)" OFF)
if(DEPOT_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DEPOT_FUZZ=ON needs clang (-DCMAKE_CXX_COMPILER="
                        "clang++ -DCMAKE_C_COMPILER=clang), not "
                        "${CMAKE_CXX_COMPILER_ID}")
  endif()
  add_compile_options(-fsanitize=address,undefined -fsanitize=fuzzer-no-link
                      -fno-sanitize-recover=undefined -fno-omit-frame-pointer
                      -gline-tables-only)
  add_link_options(-fsanitize=address,undefined)
endif()
