#include "crypto/mask.h"

#include <openssl/evp.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace xsilo::crypto {

namespace {

constexpr std::size_t kBlock = 16 * 1024;  // keystream generated in L1-sized pieces
constexpr std::size_t kPiece = 8 * 1024;   // masks applied to the vector this much at a time
constexpr std::size_t kBatch = 64;         // masks applied in one pass
static_assert(kPiece <= kBlock);

alignas(64) const std::uint8_t kZeros[kBlock] = {};

struct Ctr {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  explicit Ctr(const Secret& seed) {
    if (!ctx || EVP_EncryptInit_ex(ctx, EVP_aes_128_ctr(), nullptr, seed.bytes().data(),
                                   seed.bytes().data() + 16) != 1) {
      throw std::runtime_error("AES-128-CTR initialisation failed");
    }
  }
  ~Ctr() { EVP_CIPHER_CTX_free(ctx); }
  // Fills `out` with the next keystream bytes: CTR mode XORs the keystream onto its input,
  // so encrypting zeros yields the keystream itself.
  void next(std::uint8_t* out, std::size_t n) {
    int len = 0;
    EVP_EncryptUpdate(ctx, out, &len, kZeros, static_cast<int>(n));
  }
};

// v[k] += (a[k] + b[k]), or -= with Sub, for the words of T in two keystream buffers: two masks
// per load and store of the vector's piece.
template <class T, bool Sub>
[[gnu::always_inline]] inline void add_two(T* __restrict v, const std::uint8_t* a, const std::uint8_t* b,
                                           std::size_t n) {
  for (std::size_t k = 0; k < n; ++k) {
    T x, y;
    std::memcpy(&x, a + k * sizeof(T), sizeof(T));
    std::memcpy(&y, b + k * sizeof(T), sizeof(T));
    const T s = static_cast<T>(x + y);  // unsigned: wraps mod 2^bits (after promotion)
    v[k] = Sub ? static_cast<T>(v[k] - s) : static_cast<T>(v[k] + s);
  }
}

// The same loop built twice: for the portable baseline, and with AVX2 for the CPUs that have it
// (chosen at run time, so the default build runs everywhere).
template <class T, bool Sub>
void add_two_baseline(T* __restrict v, const std::uint8_t* a, const std::uint8_t* b, std::size_t n) {
  add_two<T, Sub>(v, a, b, n);
}

std::atomic<bool> portable_only{false};  // set_mask_kernel(MaskKernel::Portable)

#if defined(__x86_64__) || defined(__i386__)
template <class T, bool Sub>
[[gnu::target("avx2")]] void add_two_avx2(T* __restrict v, const std::uint8_t* a, const std::uint8_t* b,
                                          std::size_t n) {
  add_two<T, Sub>(v, a, b, n);
}

template <class T, bool Sub>
auto add_two_kernel() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 && !portable_only ? &add_two_avx2<T, Sub> : &add_two_baseline<T, Sub>;
}
#else
template <class T, bool Sub>
auto add_two_kernel() {
  return &add_two_baseline<T, Sub>;
}
#endif

template <class T>
void add_masks_impl(std::span<const MaskTerm> terms, std::span<T> vec) {
  // Up to kBatch ciphers live at once (about 700 bytes each): thousands of terms (a server
  // removing masks after many dropouts) take a pass per batch rather than megabytes of cipher
  // state that would push the vector's piece out of L1.
  if (terms.size() > kBatch) {
    for (std::size_t b = 0; b < terms.size(); b += kBatch) {
      add_masks_impl(terms.subspan(b, std::min(kBatch, terms.size() - b)), vec);
    }
    return;
  }
  // The masks to add, then those to subtract (the order of a sum mod 2^bits is free), so that
  // they go into the vector two at a time; an odd one out is paired with zeros.
  std::vector<std::unique_ptr<Ctr>> adds, subs;
  for (const auto& t : terms) (t.sign > 0 ? adds : subs).push_back(std::make_unique<Ctr>(t.seed));
  const auto add = add_two_kernel<T, false>();
  const auto sub = add_two_kernel<T, true>();
  // The piece of vec and the two keystream buffers together stay within a 32 KiB L1 cache.
  alignas(64) std::uint8_t a[kPiece];
  alignas(64) std::uint8_t b[kPiece];
  constexpr std::size_t per = kPiece / sizeof(T);
  for (std::size_t i = 0; i < vec.size(); i += per) {
    const std::size_t n = std::min(per, vec.size() - i);
    T* v = vec.data() + i;
    for (const auto* list : {&adds, &subs}) {
      const auto kernel = list == &adds ? add : sub;
      for (std::size_t j = 0; j < list->size(); j += 2) {
        (*list)[j]->next(a, n * sizeof(T));
        const std::uint8_t* second = kZeros;
        if (j + 1 < list->size()) {
          (*list)[j + 1]->next(b, n * sizeof(T));
          second = b;
        }
        kernel(v, a, second, n);
      }
    }
  }
}

template <class T>
void add_mask_impl(const Secret& seed, std::span<T> vec, int sign) {
  const MaskTerm one{seed, sign};
  add_masks_impl(std::span<const MaskTerm>(&one, 1), vec);
}

}  // namespace

void add_masks(std::span<const MaskTerm> terms, std::span<std::uint32_t> vec) { add_masks_impl(terms, vec); }
void add_masks(std::span<const MaskTerm> terms, std::span<std::uint64_t> vec) { add_masks_impl(terms, vec); }
void add_masks(std::span<const MaskTerm> terms, std::span<std::uint16_t> vec) { add_masks_impl(terms, vec); }
void add_masks(std::span<const MaskTerm> terms, std::span<std::uint8_t> vec) { add_masks_impl(terms, vec); }
void add_mask(const Secret& seed, std::span<std::uint8_t> vec, int sign) { add_mask_impl(seed, vec, sign); }
void add_mask(const Secret& seed, std::span<std::uint16_t> vec, int sign) { add_mask_impl(seed, vec, sign); }
void add_mask(const Secret& seed, std::span<std::uint32_t> vec, int sign) { add_mask_impl(seed, vec, sign); }
void add_mask(const Secret& seed, std::span<std::uint64_t> vec, int sign) { add_mask_impl(seed, vec, sign); }

void set_mask_kernel(MaskKernel k) { portable_only = k == MaskKernel::Portable; }

void keystream(const Secret& seed, std::span<std::uint8_t> out) {
  Ctr ctr(seed);
  for (std::size_t i = 0; i < out.size(); i += kBlock) ctr.next(out.data() + i, std::min(kBlock, out.size() - i));
}

}  // namespace xsilo::crypto
