// numpy's .npz (a zip of .npy arrays, stored uncompressed), for data files that researchers
// load with one call: `d = numpy.load("train.npz"); d["x"], d["y"]`.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/dataset.h"

namespace xsilo {

// One array of an .npz: its name ("x"), numpy dtype ("<f4", "<i8") and shape, and its bytes
// (little-endian, C order).
struct NpyArray {
  std::string name, dtype;
  std::vector<std::uint64_t> shape;
  std::string bytes;
};

// Writes the arrays as PATH (a zip without compression; each member NAME.npy, format 1.0).
// Throws std::runtime_error naming the file when it cannot be written or exceeds 4 GiB.
void save_npz(const std::filesystem::path& path, const std::vector<NpyArray>& arrays);

// A data set as "x" (float32, rows x features) and "y" (int64 labels, rows).
void save_npz(const std::filesystem::path& path, const Dataset& d);

}  // namespace xsilo
