// One upload at a time into one buffer: who is ready (in order), who holds the grant, every
// chunk checked against the expected layout and copied into place, and the checks of the bytes
// (SHA-256, finiteness of float32 elements) handed out as work to run off the network thread,
// chunk by chunk, while the next chunk arrives. Taking uploads one at a time means a peer that
// vanishes mid-upload never leaves half an update anywhere; the buffer is reused.
//
// A buffer may name a sink: each chunk is then handed to it as soon as it is in place (on the
// network thread), and the chunk's check work reads it back from the sink rather than from the
// buffer. The server stages the uploads of big models in a file that way, so that the buffer
// needs no memory of its own and a check that lags the network holds the page cache, not the
// process (server/upload_stage.h).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/model.h"
#include "crypto/hash.h"
#include "proto/status.h"
#include "protocol/tensor_stream.h"

namespace xsilo::protocol {

// What the checks found; written only by the check work, which runs in order on one worker.
struct UploadCheck {
  crypto::Sha256 hash;
  bool finite = true;
  std::string sink_error;  // the first failure of the buffer's sink ("" when none)
};

// The verdict on an upload whose bytes are all in, the same wherever it lands (the server, of a
// silo's update or an edge's partial sum; an edge, of its silos' updates): its SHA-256 as
// received, and why it may not be used, if so. `what` names it in the reason ("update",
// "partial sum"); `declared` is the sender's UpdateEnd.update_sha256, shown escaped.
struct UploadVerdict {
  enum class Problem { None, NonFinite, HashMismatch };
  std::string sha256;
  Problem problem = Problem::None;
  std::string why;
};
UploadVerdict verify_upload(UploadCheck& check, const std::string& declared, const std::string& what);

// Where the bytes of an upload go once in place: put() on the network thread, right after the
// chunk was decoded into the buffer (which it may then reuse); get() on the worker, by the
// chunk's check work. `at` is the byte offset in the buffer. Both return "" or why not.
class UploadSink {
 public:
  virtual ~UploadSink() = default;
  virtual std::string put(std::uint64_t at, std::span<const std::uint8_t> bytes) = 0;
  virtual std::string get(std::uint64_t at, std::span<std::uint8_t> into) = 0;
};

// Where an upload goes and what it must look like.
struct UploadBuffer {
  std::span<std::uint8_t> bytes;
  wire::DType dtype = wire::F32;     // F32 (updates) or U8/U16/U32/U64 (masked words)
  std::vector<TensorInfo> layout;    // in elements
  bool hash = true;                  // SHA-256 of the bytes as received
  std::shared_ptr<const void> keep;  // keeps `bytes` alive while check work is queued (optional)
  wire::Compression scheme;          // F32: how the uploader must compress (protocol/compression.h)
  std::shared_ptr<UploadSink> sink;  // takes each chunk's bytes once in place (optional)
};

// The work that checks `count` elements at `first` (hash, and finiteness for F32).
std::function<void()> check_work(std::shared_ptr<UploadCheck> check, const std::uint8_t* first,
                                 std::size_t count, wire::DType dtype, bool hash,
                                 std::shared_ptr<const void> keep = nullptr);
// The same for elements a `sink` took: they are read back from it, as the bytes at `at`;
// `put_error` is what the sink's put() said of them (not "": the check fails with it, and
// sink_error keeps the upload's first failure).
std::function<void()> staged_check_work(std::shared_ptr<UploadCheck> check, std::shared_ptr<UploadSink> sink,
                                        std::uint64_t at, std::size_t count, wire::DType dtype, bool hash,
                                        std::string put_error);

template <class Key>
class UploadSlot {
 public:
  void enqueue(Key who) { queue_.push_back(std::move(who)); }
  bool empty_queue() const { return queue_.empty(); }

  // The first queued key for which `eligible(key)` holds, out of the queue (keys before it that
  // are no longer eligible leave it too); nothing when none is. Then open() the slot to it.
  template <class Eligible>
  std::optional<Key> next(Eligible&& eligible) {
    while (!queue_.empty()) {
      Key k = std::move(queue_.front());
      queue_.pop_front();
      if (eligible(k)) return k;
    }
    return std::nullopt;
  }
  // Grants the slot to `who`: its upload goes into `into`.
  void open(Key who, UploadBuffer into) {
    holder_ = std::move(who);
    complete_ = false;
    buffer_ = std::move(into);
    check_ = std::make_shared<UploadCheck>();
    if (buffer_.dtype == wire::F32) {
      rx_.reset({reinterpret_cast<float*>(buffer_.bytes.data()), buffer_.bytes.size() / sizeof(float)},
                buffer_.layout, /*hash=*/false, buffer_.scheme);
    } else {
      rx_.reset_words(buffer_.bytes, buffer_.layout, buffer_.dtype, /*hash=*/false);
    }
  }

  bool busy() const { return holder_.has_value(); }
  bool held_by(const Key& who) const { return holder_ && *holder_ == who; }
  const std::optional<Key>& holder() const { return holder_; }
  bool complete() const { return complete_; }   // UpdateEnd arrived: being validated and folded

  // A chunk from the holder: checked and copied. Returns the check work for what it wrote.
  proto::Result<std::function<void()>> add(const wire::TensorChunk& chunk) {
    if (!busy() || complete_) return proto::error(wire::UNEXPECTED, "TensorChunk without an open UploadGrant");
    if (auto st = rx_.add(chunk); !st) return st;
    const std::size_t elem = element_bytes(buffer_.dtype);
    const std::uint64_t at = rx_.last_first() * elem;
    if (!buffer_.sink) {
      return check_work(check_, buffer_.bytes.data() + at, rx_.last_count(), buffer_.dtype, buffer_.hash, buffer_.keep);
    }
    return staged_check_work(check_, buffer_.sink, at, rx_.last_count(), buffer_.dtype, buffer_.hash,
                             buffer_.sink->put(at, {buffer_.bytes.data() + at, rx_.last_count() * elem}));
  }
  // UpdateEnd from the holder: "" when every element arrived, else why not.
  [[nodiscard]] std::string end(std::string_view what = "update") {
    if (!rx_.complete()) {
      return std::string(what) + " has " + std::to_string(rx_.received()) + " of the " + std::to_string(expected()) +
             " elements";
    }
    complete_ = true;
    return "";
  }
  std::shared_ptr<UploadCheck> check() const { return check_; }
  std::uint64_t bytes_received() const { return rx_.bytes(); }
  // Closes the slot (folded, refused or abandoned); the queue stays.
  void release() {
    holder_.reset();
    complete_ = false;
  }
  void clear() {
    release();
    queue_.clear();
  }

 private:
  std::size_t expected() const { return elements(buffer_.layout); }
  std::deque<Key> queue_;
  std::optional<Key> holder_;
  bool complete_ = false;
  UploadBuffer buffer_;
  TensorReceiver rx_;
  std::shared_ptr<UploadCheck> check_;
};

}  // namespace xsilo::protocol
