// A window: address space for a whole model that is reserved, not backed by memory (anonymous,
// MAP_NORESERVE). Code that writes a model into place chunk by chunk (the tensor receivers) can
// write into it; whoever consumes each chunk as it comes (hashes it, writes it to a file) then
// gives its pages back, so only the chunks in flight are ever resident. Pages given back read
// as zeros when touched again.
#pragma once

#include <cstdint>
#include <span>

namespace xsilo {

class Window {
 public:
  // Throws std::runtime_error when `bytes` of address space cannot be reserved.
  explicit Window(std::uint64_t bytes);
  ~Window();
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  std::span<std::uint8_t> bytes() const { return {base_, size_}; }
  // Gives back the pages of [from, to) once that range has been consumed, rounding `from` down
  // (the bytes before it were consumed earlier: chunks come in order) and `to` down too unless
  // it is the end (a page shared with the next chunk goes with that one).
  void release(std::uint64_t from, std::uint64_t to);

 private:
  std::uint8_t* base_ = nullptr;
  std::uint64_t size_ = 0;
};

}  // namespace xsilo
