// The session's upload part: which chunks an upload is made of. Four sources, one per way a
// round's update exists: the masked words of a secure round, the chunks compression made, the
// delta of a streamed round (made again, chunk by chunk, as it is sent) or the update held.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "protocol/masked.h"
#include "protocol/tensor_stream.h"
#include "silo_agent/update.h"

namespace xsilo::agent {

// `masked`: the round's masked input when it is secure (then it is what goes up), else null.
std::shared_ptr<protocol::ChunkSource> upload_source(const RoundOutput& pending,
                                                     const std::shared_ptr<protocol::MaskedVector>& masked,
                                                     const std::string& federation, std::uint64_t round,
                                                     std::size_t chunk_bytes);

}  // namespace xsilo::agent
