#include "transport/policy.h"

#include <algorithm>

namespace xsilo::transport {

std::chrono::milliseconds AcceptBackoff::failed() {
  ++failures_;
  pause_ = pause_.count() == 0 ? kFirst : std::min(kMax, pause_ * 2);
  return pause_;
}

void AcceptBackoff::succeeded() {
  pause_ = std::chrono::milliseconds(0);
  failures_ = 0;
}

bool LogLimit::allow(SteadyTime now) {
  if (last_ && now - *last_ <= period_) return false;
  last_ = now;
  return true;
}

bool IdleWatch::silent_too_long(SteadyTime now) const {
  return timeout_.count() > 0 && now - last_heard_ > timeout_;
}

bool IdleWatch::write_stalled(std::optional<SteadyTime> writing_since, SteadyTime now) const {
  return timeout_.count() > 0 && writing_since && now - *writing_since > timeout_;
}

std::chrono::milliseconds IdleWatch::tick() const {
  return std::max(std::chrono::milliseconds(50), std::min(timeout_ / 4, std::chrono::milliseconds(1000)));
}

bool HandshakeSlots::take(const std::string& address) {
  if (total_ >= max_total_ || from(address) >= max_per_address_) return false;
  ++total_;
  ++from_[address];
  return true;
}

void HandshakeSlots::give_back(const std::string& address) {
  auto it = from_.find(address);
  if (it == from_.end()) return;  // never taken: nothing to give back
  --total_;
  if (--it->second == 0) from_.erase(it);
}

std::size_t HandshakeSlots::from(const std::string& address) const {
  auto it = from_.find(address);
  return it == from_.end() ? 0 : it->second;
}

ScrapeSlots::Admission ScrapeSlots::admit(Id id, SteadyTime now) {
  Admission a;
  if (open_.size() >= max_) {
    if (waiting_.empty()) return a;  // every slot is answering a request: refused
    a.evict = waiting_.front();
    waiting_.pop_front();
    open_.erase(*a.evict);
  }
  a.admitted = true;
  a.deadline = now + timeout_;
  open_.insert(id);
  waiting_.push_back(id);
  return a;
}

void ScrapeSlots::request_read(Id id) {
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
}

void ScrapeSlots::done(Id id) {
  open_.erase(id);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
}

}  // namespace xsilo::transport
