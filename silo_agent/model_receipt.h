// The session's model receipt: a round's model as its chunks arrive, after its RoundStart. Either
// into the model this silo holds (whole, or a compressed broadcast's delta added onto the held
// model when that is the round's base) or, when nothing of the model is kept (a trainer that
// streams), hashed as it arrives through a window of reserved address space whose pages go back
// chunk by chunk. It also remembers which model the silo holds, checked: the next round's delta
// goes onto it, and a restarted server may ask for it. Network thread only, like the session;
// a training job shares the model it was given.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/model.h"
#include "common/window.h"
#include "proto/xsilo.pb.h"
#include "protocol/tensor_stream.h"

namespace xsilo::agent {

class ModelReceipt {
 public:
  // Readies the receipt of `rs`'s model. `may_stream`: the round needs nothing of the model once
  // trained (a trainer that streams, no tamper hook, no secure aggregation, no compression, no
  // momentum); a compressed broadcast keeps the model even then, for the next round's delta.
  void prepare(const wire::RoundStart& rs, bool may_stream);

  // A model is on its way (or here): its chunks have somewhere to go.
  bool open() const { return model_ || streaming(); }
  bool complete() const { return rx_.complete(); }
  // A chunk of the model, checked and put in place (a streamed round's pages go back after it).
  proto::Status add(const wire::TensorChunk& chunk);
  // The model was refused: nothing of it is kept.
  void drop();

  // A streamed round: the model is hashed as it arrives, and nothing of it is kept.
  bool streaming() const { return window_ != nullptr; }
  // The round's model; null when streamed.
  const std::shared_ptr<Model>& model() const { return model_; }
  // A streamed round's layout, the SHA-256 of what arrived and how many values did.
  const std::vector<TensorInfo>& layout() const { return layout_; }
  std::string finish_sha256() { return rx_.finish_sha256(); }
  std::size_t received() const { return rx_.received(); }

  // The model held is `sha`, as a training job checked it against its round's RoundStart ("" or
  // a streamed round: nothing changes).
  void hold(const std::string& sha);
  // The SHA-256 of the model held once checked; "" while it is being replaced or was never checked.
  const std::string& held_sha() const { return held_sha_; }

 private:
  std::shared_ptr<Model> model_;
  std::string held_sha_;
  std::unique_ptr<Window> window_;
  std::vector<TensorInfo> layout_;
  protocol::TensorReceiver rx_;
};

}  // namespace xsilo::agent
