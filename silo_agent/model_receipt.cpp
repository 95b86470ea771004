#include "silo_agent/model_receipt.h"

#include "protocol/compression.h"

namespace xsilo::agent {

void ModelReceipt::prepare(const wire::RoundStart& rs, bool may_stream) {
  Model layout;
  for (const auto& t : rs.tensors()) layout.add_layout(t.name(), {t.shape().begin(), t.shape().end()});
  // A compressed broadcast comes as a delta against the model this silo holds when the server
  // knows it holds the round's base (it said so in its last UpdateReady), else whole.
  const bool broadcast = protocol::compressed(rs.broadcast());
  const bool have_base = broadcast && !rs.base_sha256().empty() && held_sha_ == rs.base_sha256() && model_ &&
                         model_->same_layout(layout);
  held_sha_.clear();  // whatever comes now replaces the model held
  // A compressed broadcast keeps the model even for a trainer that could stream: the next
  // round's delta goes onto it.
  if (may_stream && !broadcast) {
    // Nothing of the model is kept: it is hashed as it arrives, through a window of reserved
    // address space whose pages go back after each chunk.
    model_.reset();
    layout_ = layout.tensors();
    const std::size_t d = elements(layout_);
    if (!window_ || window_->bytes().size() != d * sizeof(float)) {
      window_.reset();
      window_ = std::make_unique<Window>(d * sizeof(float));
    }
    rx_.reset({reinterpret_cast<float*>(window_->bytes().data()), d}, layout_, /*hash=*/true);
  } else {
    window_.reset();
    if (have_base && model_.use_count() > 1) {
      model_ = std::make_shared<Model>(*model_);  // a job still reads the base: the delta goes onto a copy
    } else if (!have_base && (!model_ || model_.use_count() > 1 || !model_->same_layout(layout))) {
      // Reuse last round's buffer when nothing else holds it: no fresh pages every round.
      model_ = std::make_shared<Model>();
      for (const auto& t : layout.tensors()) model_->add(t.name, t.shape);
    }
    if (broadcast) rx_.reset_model(model_->flat(), model_->tensors(), rs.broadcast(), have_base, /*hash=*/false);
    else rx_.reset(model_->flat(), model_->tensors(), /*hash=*/false);
  }
}

proto::Status ModelReceipt::add(const wire::TensorChunk& chunk) {
  auto st = rx_.add(chunk);
  if (st && streaming()) window_->release(rx_.last_first() * sizeof(float), (rx_.last_first() + rx_.last_count()) * sizeof(float));
  return st;
}

void ModelReceipt::drop() {
  model_.reset();
  window_.reset();
}

void ModelReceipt::hold(const std::string& sha) {
  if (model_ && !sha.empty()) held_sha_ = sha;
}

}  // namespace xsilo::agent
