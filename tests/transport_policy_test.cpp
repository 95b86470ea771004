// The transport's timing and admission decisions (transport/policy.h) with time moved by hand:
// the deterministic counterparts of the loopback tests in pki_tls_test.cpp and metrics_test.cpp
// that watch real time (docs/testing.md, "Tests that depend on timing").
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "transport/policy.h"

namespace xsilo::transport {
namespace {

using std::chrono::milliseconds;
using namespace std::chrono_literals;

const SteadyTime t0{};  // the tests' own epoch: no clock is read

// Counterpart of TlsTest.AcceptFailuresBackOffInsteadOfSpinning: the exact schedule of pauses,
// its cap, and the fresh start after a success; the loopback test's window of 1.8 s fits the
// attempts these pauses sum to.
TEST(AcceptBackoff, PausesTenMillisecondsDoublingToOneSecondAndStartsOverAfterASuccess) {
  AcceptBackoff b;
  std::vector<milliseconds> pauses;
  for (int i = 0; i < 10; ++i) pauses.push_back(b.failed());
  EXPECT_EQ(pauses, (std::vector<milliseconds>{10ms, 20ms, 40ms, 80ms, 160ms, 320ms, 640ms, 1000ms, 1000ms, 1000ms}));
  EXPECT_EQ(b.failures_in_a_row(), 10u);
  b.succeeded();
  EXPECT_EQ(b.failures_in_a_row(), 0u);
  EXPECT_EQ(b.failed(), 10ms);
  EXPECT_EQ(b.failed(), 20ms);
}

// How many accept attempts fail within a window when every attempt fails at once: what the
// loopback test bounds (2 to 12 in 1.5 s) is 8 here, where a loop without backoff would make
// as many as the window has room for.
TEST(AcceptBackoff, FailingForOneAndAHalfSecondsMakesEightAttemptsNotASpin) {
  AcceptBackoff b;
  SteadyTime now = t0;
  const SteadyTime end = t0 + 1500ms;
  int attempts = 0;
  while (now <= end) {
    ++attempts;
    now += b.failed();
  }
  EXPECT_EQ(attempts, 8);  // at 0, 10, 30, 70, 150, 310, 630 and 1270 ms
}

TEST(LogLimit, LogsTheFirstLineAndThenAtMostOneAPeriod) {
  LogLimit limit(1s);
  EXPECT_TRUE(limit.allow(t0 + 5s));
  EXPECT_FALSE(limit.allow(t0 + 5s + 1ms));
  EXPECT_FALSE(limit.allow(t0 + 6s));  // exactly a period later: not yet
  EXPECT_TRUE(limit.allow(t0 + 6s + 1ms));
  EXPECT_FALSE(limit.allow(t0 + 6s + 500ms));
}

// Counterpart of TlsTest.IdlePeersAreClosedAndHeartbeatsKeepThemOpen: the loopback test's
// settings (an idle timeout of 400 ms, heartbeats every 100 ms) with the watchdog's own ticks,
// replayed for two seconds. The silent peer is closed at the first tick past 400 ms (500 ms,
// ticks being a quarter of the timeout); the one that sends a heartbeat every 100 ms never is.
TEST(IdleWatch, ASilentPeerIsClosedAtTheFirstTickPastItsTimeoutAndHeartbeatsKeepAPeerOpen) {
  IdleWatch silent(400ms, t0), chatty(400ms, t0);
  ASSERT_EQ(silent.tick(), 100ms);
  std::optional<milliseconds> silent_closed, chatty_closed;
  for (milliseconds t = 0ms; t <= 2000ms; t += 10ms) {
    const SteadyTime now = t0 + t;
    if (t.count() > 0 && t % 100ms == 0ms) chatty.heard(now);  // a heartbeat arrives
    if (t.count() > 0 && t % silent.tick() == 0ms) {            // the watchdog looks
      if (!silent_closed && silent.silent_too_long(now)) silent_closed = t;
      if (!chatty_closed && chatty.silent_too_long(now)) chatty_closed = t;
    }
  }
  ASSERT_TRUE(silent_closed.has_value());
  EXPECT_EQ(*silent_closed, 500ms);
  EXPECT_FALSE(chatty_closed.has_value()) << "closed at " << chatty_closed->count() << " ms";
}

// The boundary, a heartbeat held up, and the tick's limits.
TEST(IdleWatch, SilentTooLongOnlyStrictlyPastTheTimeoutSinceTheLastFrame) {
  IdleWatch w(400ms, t0);
  EXPECT_FALSE(w.silent_too_long(t0 + 400ms));
  EXPECT_TRUE(w.silent_too_long(t0 + 401ms));
  w.heard(t0 + 390ms);  // a heartbeat 290 ms late still arrives in time
  EXPECT_FALSE(w.silent_too_long(t0 + 790ms));
  EXPECT_TRUE(w.silent_too_long(t0 + 791ms));
  EXPECT_FALSE(IdleWatch(0ms, t0).silent_too_long(t0 + 24h)) << "a zero timeout never closes";
  EXPECT_EQ(IdleWatch(100ms, t0).tick(), 50ms);     // a quarter, but at least 50 ms
  EXPECT_EQ(IdleWatch(30000ms, t0).tick(), 1000ms);  // a quarter, but at most 1 s
  EXPECT_EQ(IdleWatch(2000ms, t0).tick(), 500ms);
}

// Counterpart of TlsTest.APeerThatStopsReadingIsClosedAfterTheIdleTimeout: a write that has
// waited on the peer for more than the timeout is stalled, however recently the peer was heard
// (its heartbeats); no write waiting, or a zero timeout, never is.
TEST(IdleWatch, AWriteThatWaitsOnThePeerPastTheTimeoutIsStalledWhateverItHears) {
  IdleWatch w(400ms, t0);
  w.heard(t0 + 900ms);  // a heartbeat just arrived
  EXPECT_FALSE(w.write_stalled(std::nullopt, t0 + 1000ms)) << "nothing is being written";
  EXPECT_FALSE(w.write_stalled(t0 + 600ms, t0 + 1000ms));  // at the timeout, not past it
  EXPECT_TRUE(w.write_stalled(t0 + 599ms, t0 + 1000ms));
  EXPECT_FALSE(w.silent_too_long(t0 + 1000ms)) << "the peer is not silent: only its reading stopped";
  EXPECT_FALSE(IdleWatch(0ms, t0).write_stalled(t0, t0 + 24h)) << "a zero timeout never closes";
}

// Counterpart of TlsTest.AHandshakeFloodIsCappedAndAGoodClientStillGetsIn, with the loopback
// test's caps (16 in all, 4 per address): a flood of 200 from one address holds 4 slots, a good
// client from another gets in at once, many addresses are held to 16 in all, and the slots
// come back as the flood's handshakes end.
TEST(HandshakeSlots, AFloodHoldsOnlyItsAddresssCapAndAGoodClientStillGetsIn) {
  HandshakeSlots slots(16, 4);
  int admitted = 0, shed = 0;
  for (int i = 0; i < 200; ++i) (slots.take("127.0.0.2") ? admitted : shed) += 1;
  EXPECT_EQ(admitted, 4);
  EXPECT_EQ(shed, 196);
  EXPECT_EQ(slots.in_progress(), 4u);
  EXPECT_EQ(slots.from("127.0.0.2"), 4u);

  EXPECT_TRUE(slots.take("127.0.0.1")) << "the good client";
  slots.give_back("127.0.0.1");  // its handshake finished

  // Eight more addresses, four connections each: the total cap holds (4 + 12 admitted).
  int wide_admitted = 0;
  for (int a = 3; a <= 10; ++a) {
    for (int i = 0; i < 4; ++i) wide_admitted += slots.take("127.0.0." + std::to_string(a));
  }
  EXPECT_EQ(wide_admitted, 12);
  EXPECT_EQ(slots.in_progress(), 16u);
  EXPECT_FALSE(slots.take("127.0.0.1")) << "every slot taken: even a good client waits";

  // One handshake of the flood times out: its slot is free again, for any address.
  slots.give_back("127.0.0.2");
  EXPECT_EQ(slots.from("127.0.0.2"), 3u);
  EXPECT_TRUE(slots.take("127.0.0.1"));
  EXPECT_FALSE(slots.take("127.0.0.11"));
}

TEST(HandshakeSlots, EveryTakenSlotComesBackAndAStrayGiveBackChangesNothing) {
  HandshakeSlots slots(3, 2);
  ASSERT_TRUE(slots.take("a"));
  ASSERT_TRUE(slots.take("a"));
  ASSERT_FALSE(slots.take("a"));
  ASSERT_TRUE(slots.take("b"));
  slots.give_back("c");  // never taken
  EXPECT_EQ(slots.in_progress(), 3u);
  slots.give_back("a");
  slots.give_back("a");
  slots.give_back("b");
  EXPECT_EQ(slots.in_progress(), 0u);
  EXPECT_EQ(slots.from("a"), 0u);
  slots.give_back("a");  // one too many
  EXPECT_EQ(slots.in_progress(), 0u);
  EXPECT_TRUE(slots.take("a") && slots.take("a"));
}

// Counterpart of MetricsEndpoint.SilentConnectionsCannotKeepAScraperOut, with the endpoint's
// eight slots: twelve silent connections and then a scraper. Each newcomer past the eighth
// evicts the oldest silent one, so the scraper is admitted at once, without waiting out anyone's
// 2 s request deadline.
TEST(ScrapeSlots, SilentConnectionsAreEvictedOldestFirstSoAScraperGetsInAtOnce) {
  ScrapeSlots slots(8, 2000ms);
  std::vector<ScrapeSlots::Id> evicted;
  for (ScrapeSlots::Id id = 0; id < 12; ++id) {
    const auto a = slots.admit(id, t0 + milliseconds(id));
    ASSERT_TRUE(a.admitted) << id;
    EXPECT_EQ(a.deadline, t0 + milliseconds(id) + 2000ms);
    if (a.evict) evicted.push_back(*a.evict);
  }
  EXPECT_EQ(evicted, (std::vector<ScrapeSlots::Id>{0, 1, 2, 3}));
  EXPECT_EQ(slots.in_use(), 8u);
  const auto scraper = slots.admit(100, t0 + 20ms);
  ASSERT_TRUE(scraper.admitted);
  ASSERT_TRUE(scraper.evict.has_value());
  EXPECT_EQ(*scraper.evict, 4u);
  EXPECT_EQ(scraper.deadline, t0 + 2020ms);
  EXPECT_EQ(slots.in_use(), 8u);
}

// A connection that has sent its request is answering and never evicted; with every slot
// answering, the newcomer is refused; a finished connection frees its slot.
TEST(ScrapeSlots, ConnectionsAnsweringAreNeverEvictedAndWhenAllAreTheNewcomerIsRefused) {
  ScrapeSlots slots(3, 2000ms);
  for (ScrapeSlots::Id id = 0; id < 3; ++id) ASSERT_TRUE(slots.admit(id, t0).admitted);
  slots.request_read(0);
  slots.request_read(2);
  const auto a = slots.admit(3, t0 + 1ms);
  ASSERT_TRUE(a.admitted);
  EXPECT_EQ(a.evict, std::optional<ScrapeSlots::Id>(1)) << "the only one still silent";
  slots.request_read(3);
  const auto refused = slots.admit(4, t0 + 2ms);
  EXPECT_FALSE(refused.admitted);
  EXPECT_FALSE(refused.evict.has_value());
  slots.done(0);
  EXPECT_EQ(slots.in_use(), 2u);
  const auto next = slots.admit(5, t0 + 3ms);
  EXPECT_TRUE(next.admitted);
  EXPECT_FALSE(next.evict.has_value());
}

}  // namespace
}  // namespace xsilo::transport
