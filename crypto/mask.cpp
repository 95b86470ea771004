#include "crypto/mask.h"

#include <openssl/evp.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace xsilo::crypto {

namespace {

constexpr std::size_t kBlock = 16 * 1024;  // keystream generated in L1-sized pieces
constexpr std::size_t kPiece = 8 * 1024;   // masks applied to the vector this much at a time
constexpr std::size_t kBatch = 64;         // masks applied in one pass

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
    alignas(64) static const std::uint8_t kZeros[kBlock] = {};
    int len = 0;
    EVP_EncryptUpdate(ctx, out, &len, kZeros, static_cast<int>(n));
  }
};

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
  std::vector<std::unique_ptr<Ctr>> ctrs;
  ctrs.reserve(terms.size());
  for (const auto& t : terms) ctrs.push_back(std::make_unique<Ctr>(t.seed));
  // The piece of vec and the keystream buffer together stay within a 32 KiB L1 cache.
  alignas(64) std::uint8_t buf[kPiece];
  constexpr std::size_t per = kPiece / sizeof(T);
  for (std::size_t i = 0; i < vec.size(); i += per) {
    const std::size_t n = std::min(per, vec.size() - i);
    T* __restrict v = vec.data() + i;
    for (std::size_t j = 0; j < terms.size(); ++j) {
      ctrs[j]->next(buf, n * sizeof(T));
      if (terms[j].sign > 0) {
        for (std::size_t k = 0; k < n; ++k) {
          T w;
          std::memcpy(&w, buf + k * sizeof(T), sizeof(T));
          v[k] = static_cast<T>(v[k] + w);  // unsigned: wraps mod 2^bits (after promotion)
        }
      } else {
        for (std::size_t k = 0; k < n; ++k) {
          T w;
          std::memcpy(&w, buf + k * sizeof(T), sizeof(T));
          v[k] = static_cast<T>(v[k] - w);
        }
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

void keystream(const Secret& seed, std::span<std::uint8_t> out) {
  Ctr ctr(seed);
  for (std::size_t i = 0; i < out.size(); i += kBlock) ctr.next(out.data() + i, std::min(kBlock, out.size() - i));
}

}  // namespace xsilo::crypto
