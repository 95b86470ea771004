// What this binary is and where it runs: for `xsilo --version` and the head of every benchmark,
// so that a figure always says which build (instruction set baseline) and which CPU made it.
#pragma once

#include <string>

namespace xsilo {

// "0.1.0": the project's version (CMakeLists.txt), as packages and metrics name it.
std::string build_version();
// "xsilo 0.1.0, wire protocol 5, -march=x86-64-v2" (the version proto/frame.h speaks; Frame.TheVersionLineNamesTheWireProtocolSpoken holds them together)
std::string build_info();
// The CPU's model name and its widest vector extension ("AMD EPYC 9B14 (avx512f)").
std::string cpu_info();

}  // namespace xsilo
