#include "common/window.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace xsilo {

Window::Window(std::uint64_t bytes) : size_(bytes) {
  if (size_ == 0) return;
  void* w = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (w == MAP_FAILED) {
    throw std::runtime_error("cannot reserve " + std::to_string(size_) + " bytes of address space: " +
                             std::strerror(errno));
  }
  base_ = static_cast<std::uint8_t*>(w);
}

Window::~Window() {
  if (base_) ::munmap(base_, size_);
}

void Window::release(std::uint64_t from, std::uint64_t to) {
  if (!base_ || to > size_ || from >= to) return;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t first = from / page * page;
  const std::uint64_t end = to == size_ ? (size_ + page - 1) / page * page : to / page * page;
  if (end > first) ::madvise(base_ + first, end - first, MADV_DONTNEED);
}

}  // namespace xsilo
