#include "protocol/round_start.h"

#include <set>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "crypto/fixed_point.h"
#include "crypto/skellam.h"
#include "protocol/compression.h"

namespace xsilo::protocol {

std::string round_start_statement(const wire::RoundStart& rs, const std::string& federation) {
  wire::RoundStart unsigned_part = rs;
  unsigned_part.clear_server_certificate();
  unsigned_part.clear_server_signature();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    unsigned_part.SerializeToCodedStream(&coded);
  }
  return crypto::statement("round-start", {federation, bytes});
}

void add_layout(wire::RoundStart& rs, const std::vector<TensorInfo>& layout) {
  for (const auto& t : layout) {
    auto* spec = rs.add_tensors();
    spec->set_name(t.name);
    spec->set_dtype(wire::F32);
    for (auto d : t.shape) spec->add_shape(d);
  }
}

void sign_round_start(wire::RoundStart& rs, const crypto::CertSigner& server, const std::string& federation) {
  rs.set_server_certificate(server.certificate());
  rs.set_server_signature(server.sign(round_start_statement(rs, federation)));
}

Result<std::string> round_start_signer(const wire::RoundStart& rs, const crypto::CertVerifier& ca,
                                       const std::string& federation) {
  if (rs.server_certificate().empty()) return Error("the round start is not signed by a server");
  auto server = ca.certified(rs.server_certificate(), "server");
  if (!server) return Error("the round start carries no valid server certificate: " + server.error().message());
  auto verdict = ca.verify(rs.server_certificate(), server->name, "server", round_start_statement(rs, federation),
                           rs.server_signature());
  if (!verdict) {
    return Error("the round start is not signed by server " + server->name + " (" + verdict.error().message() + ")");
  }
  return server->name;
}

std::size_t skellam_dim(const wire::Compression& c, const std::vector<TensorInfo>& layout) {
  const std::size_t d = elements(layout);
  if (c.scheme() != wire::Compression::RANDOM_K) return d;
  const std::size_t drawn_from = compressible(layout, dense_tensors(c, layout));
  return kept_count(c, drawn_from) + (d - drawn_from);
}

Status check_wire_bits(const wire::SecAggSetup& s) {
  const std::uint32_t b = s.wire_bits();
  if (b == 0) return {};
  const std::string head = "the secure setup packs its words in " + std::to_string(b) + " bits, ";
  if (s.protocol() != wire::SECAGG) return Error(head + "but its protocol masks in a prime field, where masks do not cancel mod 2^b");
  if (!s.has_skellam()) return Error(head + "but only distributed DP's words are decoded mod 2^bits");
  if (b != s.skellam().bits()) {
    return Error(head + "not the " + std::to_string(s.skellam().bits()) + " bits its distributed DP is decoded in");
  }
  if (b >= s.modulus_bits()) return Error(head + "not fewer than its ring's " + std::to_string(s.modulus_bits()));
  if (s.skellam().count_scale() > 0) {
    return Error(head + "but its adaptive-clipping count word is read in the whole ring of " +
                 std::to_string(s.modulus_bits()) + " bits");
  }
  return {};
}

Status check_layout(const wire::RoundStart& rs, std::uint64_t max_elements) {
  std::set<std::string> names;
  std::uint64_t total = 0;
  std::vector<TensorInfo> layout;
  for (const auto& t : rs.tensors()) {
    if (t.name().empty() || !names.insert(t.name()).second) {
      return Error("tensor name \"" + t.name() + "\" is empty or repeated");
    }
    std::uint64_t n = 1;
    for (auto d : t.shape()) {
      if (__builtin_mul_overflow(n, d, &n)) return Error("tensor " + t.name() + "'s shape overflows");
    }
    layout.push_back({.name = t.name(), .shape = {t.shape().begin(), t.shape().end()}, .offset = total});
    if (__builtin_add_overflow(total, n, &total) || total > max_elements) {
      return Error("the model is too large (more than " + std::to_string(max_elements) + " elements)");
    }
  }
  if (rs.has_secagg()) {
    const auto& s = rs.secagg();
    if (!crypto::ring_bits_supported(s.modulus_bits())) {
      return Error("the secure setup's ring is " + std::to_string(s.modulus_bits()) + " bits, not " +
                   crypto::kRingBits);
    }
    if (!wire::SecureProtocol_IsValid(s.protocol())) {
      return Error("the secure setup names protocol " + std::to_string(static_cast<int>(s.protocol())) +
                   ", which this build does not speak");
    }
    if (s.protocol() == wire::LIGHTSECAGG && s.modulus_bits() != 32) {
      return Error("the secure setup runs LightSecAgg, whose field words are 32 bits, on a ring of " +
                   std::to_string(s.modulus_bits()) + " bits");
    }
    if (auto packed = check_wire_bits(s); !packed) return packed.error();
    // Distributed DP: the rotated length (a power of two) of what the silos encode, and the count.
    if (s.has_skellam()) {
      const auto dim = skellam_dim(rs.compression(), layout);
      const std::size_t words = s.skellam().count_scale() > 0 ? 2 : 1;  // adaptive clipping's count word
      if (s.vector_length() != crypto::padded_length(dim) + words) {
        return Error("the secure setup's distributed-DP vector of " + std::to_string(s.vector_length()) +
                     " words is not the rotated length of the " + std::to_string(dim) + " coordinates encoded (of " +
                     std::to_string(total) + ") plus " + std::to_string(words));
      }
    } else if (s.vector_length() > total + 2) {
      return Error("the secure setup's vector of " + std::to_string(s.vector_length()) +
                   " words does not fit a model of " + std::to_string(total) + " elements");
    }
  }
  if (const auto st = check_compression(rs.compression()); !st) return Error("compression: " + st.error().message());
  if (rs.has_secagg() && compressed(rs.compression()) && rs.compression().scheme() != wire::Compression::RANDOM_K) {
    return Error("compression " + describe(rs.compression()) + " cannot be combined with secure aggregation");
  }
  if (rs.has_secagg() && rs.compression().scheme() == wire::Compression::RANDOM_K && !rs.compression().error_feedback()) {
    return Error("secure random-k needs error feedback (the server's config requires it)");
  }
  return {};
}

}  // namespace xsilo::protocol
