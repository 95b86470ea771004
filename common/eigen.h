// Eigen, included through one door. GCC 12 reports '__Y' is used uninitialized inside its own
// avx512fintrin.h when Eigen's AVX-512 packet code inlines it (GCC bug 105593, fixed in GCC 13):
// a false positive in a compiler header that -Werror must not turn into a failed build on
// AVX-512 machines. The exception covers exactly those headers' lines, nothing of ours.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <Eigen/Dense>
#pragma GCC diagnostic pop
#else
#include <Eigen/Dense>
#endif
