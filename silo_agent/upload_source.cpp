#include "silo_agent/upload_source.h"

#include <span>
#include <vector>

namespace xsilo::agent {

std::shared_ptr<protocol::ChunkSource> upload_source(const RoundOutput& pending,
                                                     const std::shared_ptr<protocol::MaskedVector>& masked,
                                                     const std::string& federation, std::uint64_t round,
                                                     std::size_t chunk_bytes) {
  if (masked) {
    return std::make_shared<protocol::ChunkSource>(masked, masked->bytes(), masked->dtype(),
                                                   std::vector<TensorInfo>{{"masked", {masked->words()}, 0}},
                                                   federation, round, chunk_bytes, masked->wire_bits());
  }
  if (pending.encoded) return std::make_shared<protocol::ChunkSource>(pending.encoded, federation, round);
  if (pending.stream) {
    return std::make_shared<protocol::ChunkSource>(
        [out = std::make_shared<const RoundOutput>(pending)](std::size_t first, std::span<float> values) {
          fill_streamed_update(*out, first, values);
        },
        pending.layout, federation, round, chunk_bytes);
  }
  const auto& u = pending.update;
  return std::make_shared<protocol::ChunkSource>(u, u->flat(), u->tensors(), federation, round, chunk_bytes);
}

}  // namespace xsilo::agent
