# Warnings, sanitizers and the include root, applied to every xsilo target.
add_library(xsilo_options INTERFACE)
target_include_directories(xsilo_options INTERFACE ${PROJECT_SOURCE_DIR})
target_compile_options(xsilo_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
  # GCC 12 reports std::variant and std::optional members as "maybe uninitialized" at -O2
  # (GCC bug 105562 and friends): false positives that would break -Werror builds.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-maybe-uninitialized>
  # GCC 12 reports "literal" + std::string&& as overlapping memcpy inside libstdc++ (GCC bug
  # 105651, fixed in GCC 13): a false positive whose report depends on inlining, so on -O2
  # and the instruction set. Off for GCC 12 only.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${XSILO_WERROR}>>:-Werror>
  # No fused multiply-add unless the code asks for one: the values a silo hashes and the values
  # a receiver decodes (PowerSGD's P Q^T, a broadcast's base + delta) must be the same bits on a
  # portable build and on an x86-64-v3 or native one, where GCC would otherwise fuse a * b + c
  # across statements (-ffp-contract=fast is GCC's default). Eigen's kernels call their FMA
  # intrinsics explicitly and keep them.
  $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>
  # In a unity batch every .cpp is an included file to GCC, which then warns of any coroutine
  # frame or lambda that holds a type of the file's anonymous namespace, as it would in a header.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>,$<BOOL:$<TARGET_PROPERTY:UNITY_BUILD>>>:-Wno-subobject-linkage>)
target_compile_definitions(xsilo_options INTERFACE
  BOOST_ASIO_NO_DEPRECATED XSILO_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# For every target alike: the switch changes the size of the objects that hold a ThreadCheck.
if(XSILO_THREAD_CHECKS)
  target_compile_definitions(xsilo_options INTERFACE XSILO_THREAD_CHECKS)
endif()
# Instruction set: portable by default (see XSILO_ARCH in the top CMakeLists.txt). The choice is
# compiled in, so that `xsilo --version` and every benchmark table say which build ran.
set(XSILO_BUILD_ARCH "")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
  if(XSILO_NATIVE)
    set(XSILO_BUILD_ARCH native)
  else()
    set(XSILO_BUILD_ARCH ${XSILO_ARCH})
  endif()
  target_compile_options(xsilo_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=${XSILO_BUILD_ARCH}>)
else()
  set(XSILO_BUILD_ARCH ${CMAKE_SYSTEM_PROCESSOR})
endif()
target_compile_definitions(xsilo_options INTERFACE XSILO_BUILD_ARCH="${XSILO_BUILD_ARCH}" XSILO_VERSION="${PROJECT_VERSION}")
message(STATUS "xsilo: instruction set -march=${XSILO_BUILD_ARCH}")
if(XSILO_SANITIZE)
  # -O1 -g1 (line tables: reports still name file and line): GCC 12 compiles our coroutine-heavy
  # code with both sanitizers 2.5x faster than at -O2 -g (daemon.cpp: 72 s against 179 s); the
  # whole build takes 25 min on two cores and the suite 7.5 min at -O1 (at -O2 not timed).
  # -gz: the debug sections are compressed (ASan's symbolizer and gdb read them), which keeps the
  # build folder's 37 statically linked test programs from filling a small CI disk (4.8 GB
  # uncompressed).
  # Test programs (targets with the property XSILO_TEST_PROGRAM, tests/CMakeLists.txt) compile
  # uninstrumented: their own code is gtest's macros and checks, and UBSan and ASan made it a third
  # of the whole build (coordinator_test.cpp: 124 s, 36 s without). They link the runtimes and
  # every instrumented library, and the multi-process tests run the instrumented xsilo binary; an
  # inline function a test program also instantiates may be linked from its uninstrumented copy.
  target_compile_options(xsilo_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-O1 -g1 -gz -fno-omit-frame-pointer>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<NOT:$<BOOL:$<TARGET_PROPERTY:XSILO_TEST_PROGRAM>>>>:-fsanitize=address,undefined -fno-sanitize-recover=undefined>)
  target_link_options(xsilo_options INTERFACE -gz -fsanitize=address,undefined)
  # What a test asks instead of __SANITIZE_ADDRESS__, which its uninstrumented compile lacks: the
  # code it drives runs under ASan (fewer processes, no memory bounds, tests/scale_test.cpp).
  target_compile_definitions(xsilo_options INTERFACE XSILO_ASAN_BUILD)
endif()
if(XSILO_SANITIZE_THREAD)
  if(XSILO_SANITIZE)
    message(FATAL_ERROR "XSILO_SANITIZE_THREAD and XSILO_SANITIZE exclude each other: configure two builds")
  endif()
  # -O1 -g1 as for the other sanitizers. TSan instruments only what is compiled here: OpenSSL,
  # libsodium and protobuf are seen through their locks (pthread), which TSan intercepts.
  # -Wno-tsan: GCC 12 warns that TSan does not model the atomic_thread_fence in Asio's handler
  # completion (std_fenced_block); the io_context's own mutex orders what a handler sees.
  target_compile_options(xsilo_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-O1 -g1 -gz -fsanitize=thread -fno-omit-frame-pointer -Wno-tsan>)
  target_link_options(xsilo_options INTERFACE -gz -fsanitize=thread)
endif()

if(XSILO_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "XSILO_FUZZ needs clang (libFuzzer): configure with CXX=clang++ (scripts/fuzz.sh does)")
  endif()
  # Coverage for libFuzzer in every library, and AddressSanitizer to turn memory bugs into
  # crashes. Not UBSan: clang 14 fails on C++20 coroutines with it ("Cannot represent a
  # difference across sections"); the corpora run under GCC's ASan+UBSan as tests (fuzz/).
  # Line tables only: crash reports name file and line; full debug info only slows the build.
  # XSILO_FUZZ_ASAN=OFF leaves ASan out for long runs (several times the inputs a second): a
  # crash, an abort or a failed check still stops the run, and what it finds and keeps is then
  # replayed under ASan (scripts/fuzz.sh, FUZZ_ASAN=0).
  if(XSILO_FUZZ_ASAN)
    set(xsilo_fuzz_sanitizers fuzzer-no-link,address)
    target_link_options(xsilo_options INTERFACE -fsanitize=address)
  else()
    set(xsilo_fuzz_sanitizers fuzzer-no-link)
  endif()
  target_compile_options(xsilo_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-gline-tables-only -fsanitize=${xsilo_fuzz_sanitizers} -fno-omit-frame-pointer>)
  # Boost 1.74 looks for clang's coroutines TS, not C++20's: clang 14 has the latter. The
  # fuzzing convention's macro turns on crypto/fuzz_memo.h (public-key results remembered).
  target_compile_definitions(xsilo_options INTERFACE BOOST_ASIO_HAS_CO_AWAIT=1
                                                     FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)
endif()

# xsilo_library(NAME SOURCES... DEPS ...)
function(xsilo_library name)
  cmake_parse_arguments(X "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${X_SOURCES})
  target_link_libraries(${name} PUBLIC xsilo_options ${X_DEPS})
  xsilo_unity(${name})
endfunction()

# xsilo_unity(TARGET): its sources compile in batches with XSILO_UNITY (the top CMakeLists.txt).
# XSILO_UNITY_BATCH=0 puts each target's sources in one batch: a build that way finds every pair
# of files that could not share a batch, whatever batches later files make.
set(XSILO_UNITY_BATCH 8 CACHE STRING "sources per unity batch (0: a target's all in one)")
function(xsilo_unity name)
  if(XSILO_UNITY)
    set_target_properties(${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${XSILO_UNITY_BATCH})
  endif()
endfunction()
