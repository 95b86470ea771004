// Uploads into buffers of their own: who is ready (in order), who holds a grant, every chunk
// checked against the expected layout and copied into place, and the checks of the bytes
// (SHA-256, finiteness of float32 elements) handed out as work to run off the network thread,
// chunk by chunk, while the next chunk arrives (the finiteness of float32 values sent as they
// are is found while they are copied into place, and the work only records it). An upload is
// used only once it is whole and checked, so a peer that vanishes mid-upload never leaves half
// an update anywhere; buffers are reused. UploadSlot takes one upload at a time (the edge); UploadLanes up to N at a time,
// folded in grant order (the server).
//
// A buffer may name a sink: each chunk is then handed to it as soon as it is in place (on the
// network thread), and the chunk's check work reads it back from the sink rather than from the
// buffer. The server stages the uploads of big models in a file that way, so that the buffer
// needs no memory of its own and a check that lags the network holds the page cache, not the
// process (server/upload_stage.h).
#pragma once

#include <algorithm>
#include <cstdint>
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
  Status sink_status;  // the buffer's sink: its first failure, if any
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
// chunk's check work. `at` is the byte offset in the buffer. Both return success or why not.
class UploadSink {
 public:
  virtual ~UploadSink() = default;
  virtual Status put(std::uint64_t at, std::span<const std::uint8_t> bytes) = 0;
  virtual Status get(std::uint64_t at, std::span<std::uint8_t> into) = 0;
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
  std::uint32_t packed_bits = 0;     // masked words: the packed wire's bits a word (MaskedVector::wire_bits)
};

// The work that checks `count` elements at `first` (hash, and finiteness for F32). `finite`:
// whether they are all finite when that is known already (the receiver scanned them as it
// copied them: TensorReceiver::last_finite()), so that the work does not read them for it again.
std::function<void()> check_work(std::shared_ptr<UploadCheck> check, const std::uint8_t* first,
                                 std::size_t count, wire::DType dtype, bool hash,
                                 std::shared_ptr<const void> keep = nullptr,
                                 std::optional<bool> finite = std::nullopt);
// The same for elements a `sink` took: they are read back from it, as the bytes at `at`;
// `put` is what the sink's put() said of them (a failure fails the check with it, and
// sink_status keeps the upload's first failure).
std::function<void()> staged_check_work(std::shared_ptr<UploadCheck> check, std::shared_ptr<UploadSink> sink,
                                        std::uint64_t at, std::size_t count, wire::DType dtype, bool hash, Status put,
                                        std::optional<bool> finite = std::nullopt);

// One upload being received: who holds it, its buffer, its chunks checked against the layout
// and copied into place, and the check work handed out for each.
template <class Key>
class UploadLane {
 public:
  // Grants the lane to `who`: its upload goes into `into`.
  void open(Key who, UploadBuffer into) {
    holder_ = std::move(who);
    complete_ = false;
    buffer_ = std::move(into);
    check_ = std::make_shared<UploadCheck>();
    if (buffer_.dtype == wire::F32) {
      rx_.reset({reinterpret_cast<float*>(buffer_.bytes.data()), buffer_.bytes.size() / sizeof(float)},
                buffer_.layout, /*hash=*/false, buffer_.scheme);
    } else {
      rx_.reset_words(buffer_.bytes, buffer_.layout, buffer_.dtype, /*hash=*/false, buffer_.packed_bits);
    }
  }

  bool busy() const { return holder_.has_value(); }
  bool held_by(const Key& who) const { return holder_ && *holder_ == who; }
  const std::optional<Key>& holder() const { return holder_; }
  bool complete() const { return complete_; }   // UpdateEnd arrived: being validated and folded

  // A chunk from the holder: checked and copied. Returns the check work for what it wrote.
  proto::Result<std::function<void()>> add(const wire::TensorChunk& chunk) {
    return add(chunk, proto::bytes_of(chunk.data()));
  }
  // The same for a chunk whose data lies elsewhere (in the frame it came in: proto::Message).
  proto::Result<std::function<void()>> add(const wire::TensorChunk& chunk, std::span<const std::uint8_t> data) {
    if (!busy() || complete_) return proto::error(wire::UNEXPECTED, "TensorChunk without an open UploadGrant");
    if (auto st = rx_.add(chunk, data); !st) return st.error();
    const std::size_t elem = element_bytes(buffer_.dtype);
    const std::uint64_t at = rx_.last_first() * elem;
    if (!buffer_.sink) {
      return check_work(check_, buffer_.bytes.data() + at, rx_.last_count(), buffer_.dtype, buffer_.hash, buffer_.keep,
                        rx_.last_finite());
    }
    return staged_check_work(check_, buffer_.sink, at, rx_.last_count(), buffer_.dtype, buffer_.hash,
                             buffer_.sink->put(at, {buffer_.bytes.data() + at, rx_.last_count() * elem}),
                             rx_.last_finite());
  }
  // UpdateEnd from the holder: success when every element arrived, else why not.
  Status end(std::string_view what = "update") {
    if (!rx_.complete()) {
      return Error(std::string(what) + " has " + std::to_string(rx_.received()) + " of the " +
                   std::to_string(expected()) + " elements");
    }
    complete_ = true;
    return {};
  }
  std::shared_ptr<UploadCheck> check() const { return check_; }
  std::uint64_t bytes_received() const { return rx_.bytes(); }
  void release() {
    holder_.reset();
    complete_ = false;
  }

 private:
  std::size_t expected() const { return elements(buffer_.layout); }
  std::optional<Key> holder_;
  bool complete_ = false;
  UploadBuffer buffer_;
  TensorReceiver rx_;
  std::shared_ptr<UploadCheck> check_;
};

// Who is ready, in order; the first eligible of them is next.
template <class Key>
class UploadQueue {
 public:
  void enqueue(Key who) { queue_.push_back(std::move(who)); }
  bool empty_queue() const { return queue_.empty(); }
  // The first queued key for which `eligible(key)` holds, out of the queue (keys before it that
  // are no longer eligible leave it too); nothing when none is.
  template <class Eligible>
  std::optional<Key> next(Eligible&& eligible) {
    while (!queue_.empty()) {
      Key k = std::move(queue_.front());
      queue_.pop_front();
      if (eligible(k)) return k;
    }
    return std::nullopt;
  }
  void clear_queue() { queue_.clear(); }

 private:
  std::deque<Key> queue_;
};

// One upload at a time (the edge's slot): the queue and one lane.
template <class Key>
class UploadSlot : public UploadQueue<Key> {
 public:
  // Grants the slot to `who` (a key next() gave): its upload goes into `into`.
  void open(Key who, UploadBuffer into) { lane_.open(std::move(who), std::move(into)); }
  bool busy() const { return lane_.busy(); }
  bool held_by(const Key& who) const { return lane_.held_by(who); }
  const std::optional<Key>& holder() const { return lane_.holder(); }
  bool complete() const { return lane_.complete(); }
  proto::Result<std::function<void()>> add(const wire::TensorChunk& chunk) { return lane_.add(chunk); }
  proto::Result<std::function<void()>> add(const wire::TensorChunk& chunk, std::span<const std::uint8_t> data) {
    return lane_.add(chunk, data);
  }
  Status end(std::string_view what = "update") { return lane_.end(what); }
  std::shared_ptr<UploadCheck> check() const { return lane_.check(); }
  std::uint64_t bytes_received() const { return lane_.bytes_received(); }
  // Closes the slot (folded, refused or abandoned); the queue stays.
  void release() { lane_.release(); }
  void clear() {
    release();
    this->clear_queue();
  }

 private:
  UploadLane<Key> lane_;
};

// Up to `lanes` uploads at a time (the server's), each into its own buffer, folded in the order
// they were granted: a lane whose upload is complete waits for the lanes granted before it to
// be folded or given up, so the sum is the same bit for bit whatever the order the uploads end
// in (and the same as one lane's, which grants in the same order).
//
// A lane given up halfway may still have check work queued on the worker that reads its
// buffer: it is not granted again until the worker has passed that work. The caller names the
// point with a mark (its last job's number) and reports the jobs it sees done (drained()).
template <class Key>
class UploadLanes : public UploadQueue<Key> {
 public:
  explicit UploadLanes(std::size_t lanes = 1) : lanes_(lanes < 1 ? 1 : lanes) {}

  std::size_t size() const { return lanes_.size(); }
  UploadLane<Key>& operator[](std::size_t i) { return lanes_[i].lane; }
  const UploadLane<Key>& operator[](std::size_t i) const { return lanes_[i].lane; }

  // A lane that may be granted (not held, not draining); nothing when none may.
  std::optional<std::size_t> free_lane() const {
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      if (!lanes_[i].lane.busy() && !lanes_[i].draining) return i;
    }
    return std::nullopt;
  }
  // Grants lane `i` (free_lane()) to `who` until `deadline_ms`.
  void open(std::size_t i, Key who, UploadBuffer into, std::int64_t deadline_ms) {
    lanes_[i].lane.open(std::move(who), std::move(into));
    lanes_[i].granted = ++grants_;
    lanes_[i].deadline_ms = deadline_ms;
  }
  // The lane `who` holds.
  std::optional<std::size_t> lane_of(const Key& who) const {
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      if (lanes_[i].lane.held_by(who)) return i;
    }
    return std::nullopt;
  }
  bool held_by(const Key& who) const { return lane_of(who).has_value(); }
  std::size_t held() const {
    std::size_t n = 0;
    for (const auto& l : lanes_) n += l.lane.busy() ? 1 : 0;
    return n;
  }
  bool draining() const {
    return std::any_of(lanes_.begin(), lanes_.end(), [](const Entry& l) { return l.draining; });
  }
  // The held lane granted first: the one whose upload folds next.
  std::optional<std::size_t> oldest() const {
    std::optional<std::size_t> at;
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      if (lanes_[i].lane.busy() && (!at || lanes_[i].granted < lanes_[*at].granted)) at = i;
    }
    return at;
  }
  // The earliest deadline of the lanes still receiving (held, UpdateEnd not yet in).
  std::optional<std::int64_t> next_deadline() const {
    std::optional<std::int64_t> t;
    for (const auto& l : lanes_) {
      if (l.lane.busy() && !l.lane.complete() && (!t || l.deadline_ms < *t)) t = l.deadline_ms;
    }
    return t;
  }
  // The lanes still receiving whose deadline is at or before `now_ms`, earliest granted first.
  std::vector<std::size_t> overdue(std::int64_t now_ms) const {
    std::vector<std::size_t> out;
    for (std::size_t i = 0; i < lanes_.size(); ++i) {
      const auto& l = lanes_[i];
      if (l.lane.busy() && !l.lane.complete() && l.deadline_ms <= now_ms) out.push_back(i);
    }
    std::sort(out.begin(), out.end(), [&](auto a, auto b) { return lanes_[a].granted < lanes_[b].granted; });
    return out;
  }
  // Lane `i` was folded or refused after its checks ran: free at once.
  void release(std::size_t i) { lanes_[i].lane.release(); }
  // Lane `i` is given up with check work possibly still queued: free once a job numbered
  // above `mark` is done.
  void abandon(std::size_t i, std::uint64_t mark) {
    lanes_[i].lane.release();
    lanes_[i].draining = true;
    lanes_[i].mark = mark;
  }
  // The worker finished job `job`: everything queued before it has run.
  void drained(std::uint64_t job) {
    for (auto& l : lanes_) {
      if (l.draining && job > l.mark) l.draining = false;
    }
  }

 private:
  struct Entry {
    UploadLane<Key> lane;
    std::uint64_t granted = 0;  // grant order
    std::int64_t deadline_ms = 0;
    bool draining = false;
    std::uint64_t mark = 0;
  };
  std::vector<Entry> lanes_;
  std::uint64_t grants_ = 0;
};

}  // namespace xsilo::protocol
