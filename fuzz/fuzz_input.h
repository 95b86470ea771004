// What the fuzz targets share: a reader over libFuzzer's bytes, the federation's PKI made once
// per process, and a small model. Each target is one parser or one sans-I/O protocol core fed
// what another party could send (docs/benchmarks.md, "Fuzzing").
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>

#include <unistd.h>

#include <google/protobuf/stubs/logging.h>
#include <sodium.h>

#include "common/fs.h"
#include "common/model.h"
#include "crypto/certs.h"
#include "crypto/keys.h"
#include "proto/xsilo.pb.h"
#include "transport/pki.h"

namespace xsilo::fuzz {

// Protobuf logs every string field that is not UTF-8: noise at millions of inputs a minute.
inline const bool kQuietProtobuf = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

// libsodium's randomness (keys, self-mask seeds, Shamir coefficients, nonces) as a function of
// how many times it was asked since the input began: each input starts it over (Input's
// constructor), so a target does the same for the same input, as libFuzzer expects, and the
// keys of an honest secure round are the same in every input, which lets the fuzz build
// remember the public-key steps they lead to (crypto/fuzz_memo.h). Installed before libsodium
// is first initialised (crypto::ensure_sodium runs on first use).
inline std::uint64_t random_draws = 0;
inline void input_random_bytes(void* const out, const std::size_t size) {
  std::uint8_t seed[randombytes_SEEDBYTES] = {};
  std::memcpy(seed, &random_draws, sizeof random_draws);
  ++random_draws;
  randombytes_buf_deterministic(out, size, seed);
}
inline std::uint32_t input_random_u32() {
  std::uint32_t v;
  input_random_bytes(&v, sizeof v);
  return v;
}
inline const char* input_random_name() { return "xsilo-fuzz-input"; }
inline randombytes_implementation input_randomness = {input_random_name, input_random_u32, nullptr, nullptr,
                                                      input_random_bytes, nullptr};
inline const bool kInputRandomness = [] {
  const bool installed = randombytes_set_implementation(&input_randomness) == 0;
  // Lazy draws of the libraries' own (the probe of usable_public_key) are made now, before any
  // input, not in whichever input happens to come first.
  (void)crypto::usable_public_key(crypto::X25519KeyPair::public_of(crypto::Secret(crypto::Key32{9})));
  return installed;
}();

// The server's X25519 key pair of the secure targets, fixed and drawn from no generator, so that
// making it takes nothing from an input's draws.
inline const crypto::X25519KeyPair& server_box() {
  static const crypto::X25519KeyPair box = [] {
    crypto::X25519KeyPair kp;
    kp.secret = crypto::Secret(crypto::Key32{7});
    kp.public_key = crypto::X25519KeyPair::public_of(kp.secret);
    return kp;
  }();
  return box;
}

// The largest model a fuzzed RoundStart may describe (the default allows 64 GiB).
inline constexpr std::uint64_t kMaxFuzzModel = 1u << 20;

// Takes values off the front of the input; past its end every read gives zeros, so a target
// never reads out of bounds and short inputs still do something.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : p_(data), left_(size) { random_draws = 0; }
  bool more() const { return left_ > 0; }
  std::uint8_t u8() {
    if (!left_) return 0;
    --left_;
    return *p_++;
  }
  // Low byte first, in sequence: the operands of | are evaluated in no set order, and the
  // replay build (GCC) must read a corpus as the fuzz build (clang) wrote it.
  std::uint16_t u16() {
    const std::uint16_t low = u8();
    return static_cast<std::uint16_t>(low | (u8() << 8));
  }
  std::uint32_t u32() {
    const std::uint32_t low = u16();
    return low | (static_cast<std::uint32_t>(u16()) << 16);
  }
  float f32() {
    const std::uint32_t bits = u32();
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  std::string bytes(std::size_t n) {
    n = std::min(n, left_);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    left_ -= n;
    return s;
  }
  // An envelope parsed from the next length-prefixed run of bytes (protobuf decoding of
  // arbitrary bytes is part of what is fuzzed); federation and round set as given.
  wire::Envelope envelope(const std::string& federation, std::uint64_t round) {
    wire::Envelope e;
    const std::string b = bytes(u16() % 4096);
    (void)e.ParseFromString(b);
    const std::uint8_t how = u8();
    if (how & 1) e.set_federation(federation);
    if (how & 2) e.set_round(round);
    return e;
  }

 private:
  const std::uint8_t* p_;
  std::size_t left_;
};

// One CA with a server, silos silo-0..3 and an edge, made in a temporary folder the first time.
struct Pki {
  ~Pki() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::filesystem::path dir;
  crypto::CertVerifier ca;
  crypto::CertSigner server, silo;  // "server", "silo-0"
};

inline const Pki& pki() {
  static const Pki p = [] {
    auto dir = std::filesystem::temp_directory_path() / ("xsilo-fuzz-pki-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    transport::pki_init(dir, "fed");
    transport::pki_issue(dir, {wire::SERVER, "server"});
    transport::pki_issue(dir, {wire::EDGE, "edge-0"});
    for (int i = 0; i < 4; ++i) transport::pki_issue(dir, {wire::SILO, "silo-" + std::to_string(i)});
    auto signer = [&](const std::string& name) {
      const auto kit = dir / "kits" / name;
      return crypto::CertSigner::from_pem(read_file(kit / "cert.pem"), read_file(kit / "key.pem"));
    };
    return Pki{dir, crypto::CertVerifier::from_pem(read_file(dir / "ca" / "ca.pem")), signer("server"), signer("silo-0")};
  }();
  return p;
}

// Two small tensors: enough for layouts and chunking to matter, small enough to be fast.
inline Model small_model() {
  Model m;
  m.add("a", {4});
  m.add("b", {2, 3});
  for (std::size_t i = 0; i < m.size(); ++i) m.flat()[i] = 0.1f * static_cast<float>(i);
  return m;
}

}  // namespace xsilo::fuzz
