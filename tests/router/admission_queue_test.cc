// The router's admission queue (router/admission_queue.h): fairness across tenants and
// sessions, bounds, removal, expiry, and the Retry-After estimate.
#include "router/admission_queue.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace strata::router {
namespace {

Ticket push_or_die(AdmissionQueue& q, std::string_view tenant, std::string_view session,
                   int64_t now_ms = 0) {
  std::expected<Ticket, PushRefusal> t = q.push(tenant, session, now_ms);
  EXPECT_TRUE(t.has_value());
  return t.value_or(Ticket{});
}

// "t" + std::to_string(i) trips a false -Wrestrict in g++ 12.
std::string name(char prefix, uint64_t i) {
  std::string s(1, prefix);
  s += static_cast<char>('a' + i);
  return s;
}

TEST(AdmissionQueueTest, BadOptionsAreRefused) {
  EXPECT_TRUE(validate(AdmissionQueueOptions{}).has_value());
  EXPECT_FALSE(validate(AdmissionQueueOptions{.max_entries = 0}).has_value());
  EXPECT_FALSE(
      validate(AdmissionQueueOptions{.max_entries = 10, .max_per_tenant = 11}).has_value());
  EXPECT_FALSE(
      validate(AdmissionQueueOptions{.min_retry_after_s = 5, .max_retry_after_s = 2}).has_value());
}

TEST(AdmissionQueueTest, ATenantWithOneRequestIsNotStuckBehindOneWithAHundred) {
  AdmissionQueue q(AdmissionQueueOptions{.max_entries = 256, .max_per_tenant = 200});
  for (int i = 0; i < 100; ++i) push_or_die(q, "big", "agent");
  const Ticket small = push_or_die(q, "small", "chat");
  std::vector<Ticket> first;
  for (int i = 0; i < 2; ++i) first.push_back(*q.pop_next(0));
  EXPECT_TRUE(first[0] == small || first[1] == small);
  EXPECT_EQ(q.size(), 99);
  EXPECT_EQ(q.tenants(), 1);
}

TEST(AdmissionQueueTest, RoundRobinAcrossTenantsThenSessionsFifoWithinASession) {
  AdmissionQueue q;
  const Ticket a1 = push_or_die(q, "A", "s1");
  const Ticket a2 = push_or_die(q, "A", "s1");
  const Ticket a3 = push_or_die(q, "A", "s2");
  const Ticket b1 = push_or_die(q, "B", "");
  const Ticket b2 = push_or_die(q, "B", "");
  const Ticket c1 = push_or_die(q, "", "x");  // anonymous tenant
  // Tenants A, B, "" in turn; within A, sessions s1 and s2 in turn; FIFO within s1.
  const std::vector<Ticket> expected = {a1, b1, c1, a3, b2, a2};
  for (Ticket t : expected) EXPECT_EQ(q.pop_next(0), t);
  EXPECT_FALSE(q.pop_next(0));
  EXPECT_EQ(q.size(), 0);
  EXPECT_EQ(q.tenants(), 0);
}

TEST(AdmissionQueueTest, OneSessionsFanOutDoesNotStarveAnotherSessionOfItsTenant) {
  AdmissionQueue q;
  for (int i = 0; i < 20; ++i) push_or_die(q, "T", "fanout");
  const Ticket other = push_or_die(q, "T", "other");
  EXPECT_NE(q.pop_next(0), other);
  EXPECT_EQ(q.pop_next(0), other);
}

TEST(AdmissionQueueTest, BoundsRefuseAndSayWhich) {
  AdmissionQueue q(AdmissionQueueOptions{.max_entries = 4, .max_per_tenant = 3});
  for (int i = 0; i < 3; ++i) push_or_die(q, "A", "");
  EXPECT_EQ(q.push("A", "", 0).error(), PushRefusal::kTenantFull);
  push_or_die(q, "B", "");
  EXPECT_EQ(q.push("C", "", 0).error(), PushRefusal::kQueueFull);
  EXPECT_EQ(q.size(), 4);
  EXPECT_EQ(q.tenant_size("A"), 3);
  EXPECT_EQ(q.stats().refused_tenant_full, 1u);
  EXPECT_EQ(q.stats().refused_queue_full, 1u);
  EXPECT_EQ(push_refusal_name(PushRefusal::kQueueFull), "queue_full");
  // Room again after a pop.
  ASSERT_TRUE(q.pop_next(0));
  EXPECT_TRUE(q.push("C", "", 0).has_value());
}

TEST(AdmissionQueueTest, RemoveTakesAWaitingRequestOut) {
  AdmissionQueue q;
  const Ticket a = push_or_die(q, "A", "s");
  const Ticket b = push_or_die(q, "A", "s");
  const Ticket c = push_or_die(q, "B", "s");
  EXPECT_TRUE(q.remove(a));
  EXPECT_FALSE(q.remove(a));  // twice
  EXPECT_FALSE(q.contains(a));
  EXPECT_TRUE(q.remove(c));  // tenant B is gone with it
  EXPECT_EQ(q.tenants(), 1);
  EXPECT_EQ(q.pop_next(0), b);
  EXPECT_FALSE(q.remove(b));  // already admitted
  EXPECT_EQ(q.stats().removed, 2u);
}

TEST(AdmissionQueueTest, RequestsExpireAfterTheMaxWait) {
  AdmissionQueue q(AdmissionQueueOptions{.max_wait_ms = 1'000});
  const Ticket a = push_or_die(q, "A", "", 0);
  const Ticket b = push_or_die(q, "B", "", 400);
  const Ticket c = push_or_die(q, "A", "", 900);
  EXPECT_EQ(q.next_expiry_ms(), 1'000);
  EXPECT_TRUE(q.expired(999).empty());
  EXPECT_EQ(q.expired(1'000), std::vector<Ticket>{a});
  EXPECT_EQ(q.next_expiry_ms(), 1'400);
  EXPECT_TRUE(q.remove(b));
  EXPECT_EQ(q.next_expiry_ms(), 1'900);
  EXPECT_EQ(q.expired(5'000), std::vector<Ticket>{c});
  EXPECT_EQ(q.size(), 0);
  EXPECT_FALSE(q.next_expiry_ms());
  EXPECT_EQ(q.stats().expired, 2u);
}

TEST(AdmissionQueueTest, RetryAfterFollowsTheQueueAndTheAdmissionRate) {
  EXPECT_EQ(estimate_retry_after_s(0, 10.0, 1, 60), 1);
  EXPECT_EQ(estimate_retry_after_s(49, 10.0, 1, 60), 5);  // 50 ahead at 10/s
  EXPECT_EQ(estimate_retry_after_s(50, 10.0, 1, 60), 6);  // rounded up
  EXPECT_EQ(estimate_retry_after_s(10'000, 1.0, 1, 60), 60);
  EXPECT_EQ(estimate_retry_after_s(5, 0.0, 1, 60), 60);  // nothing admitted lately

  AdmissionQueue q(AdmissionQueueOptions{.max_entries = 100, .max_per_tenant = 100});
  EXPECT_EQ(q.retry_after_s(0), 60);
  for (int i = 0; i < 80; ++i) push_or_die(q, "A", name('s', static_cast<uint64_t>(i % 7)));
  // 40 admissions over 10 s: 4 per second.
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(q.pop_next(i * 250));
  EXPECT_DOUBLE_EQ(q.dequeue_rate_per_s(9'999), 4.0);
  EXPECT_EQ(q.retry_after_s(9'999), 11);  // 40 waiting + 1 at 4/s: 10.25 s
  // The rate forgets: 15 s later without an admission there is none to go by.
  EXPECT_DOUBLE_EQ(q.dequeue_rate_per_s(25'000), 0.0);
  EXPECT_EQ(q.retry_after_s(25'000), 60);
}

// Random pushes, pops, removals and expiries against a reference model of the documented
// order (tenant ring, session ring per tenant, FIFO per session).
TEST(AdmissionQueueTest, MatchesAReferenceModel) {
  constexpr int64_t kWait = 500;
  AdmissionQueue q(
      AdmissionQueueOptions{.max_entries = 40, .max_per_tenant = 25, .max_wait_ms = kWait});
  struct RefEntry {
    uint64_t id;
    std::string tenant;
    std::string session;
    int64_t at;
  };
  std::vector<RefEntry> live;  // arrival order
  std::deque<std::string> tenant_ring;
  std::map<std::string, std::deque<std::string>> session_ring;
  auto count = [&](const std::string& tenant, const std::string* session) {
    int64_t n = 0;
    for (const RefEntry& e : live) {
      n += e.tenant == tenant && (!session || e.session == *session) ? 1 : 0;
    }
    return n;
  };
  auto erase_ref = [&](uint64_t id) {
    auto it = std::ranges::find(live, id, &RefEntry::id);
    ASSERT_NE(it, live.end());
    const RefEntry e = *it;
    live.erase(it);
    if (count(e.tenant, &e.session) == 0) std::erase(session_ring[e.tenant], e.session);
    if (count(e.tenant, nullptr) == 0) std::erase(tenant_ring, e.tenant);
  };

  std::mt19937_64 rng(11);
  int64_t now = 0;
  for (int step = 0; step < 20'000; ++step) {
    now += static_cast<int64_t>(rng() % 5);
    const std::string tenant = name('t', rng() % 4);
    const std::string session = name('s', rng() % 3);
    const uint64_t op = rng() % 10;
    if (op < 5) {
      std::expected<Ticket, PushRefusal> t = q.push(tenant, session, now);
      if (static_cast<int64_t>(live.size()) >= 40) {
        ASSERT_EQ(t.error(), PushRefusal::kQueueFull);
      } else if (count(tenant, nullptr) >= 25) {
        ASSERT_EQ(t.error(), PushRefusal::kTenantFull);
      } else {
        ASSERT_TRUE(t.has_value());
        if (count(tenant, nullptr) == 0) tenant_ring.push_back(tenant);
        if (count(tenant, &session) == 0) session_ring[tenant].push_back(session);
        live.push_back(RefEntry{static_cast<uint64_t>(*t), tenant, session, now});
      }
    } else if (op < 8) {
      const std::optional<Ticket> t = q.pop_next(now);
      if (live.empty()) {
        ASSERT_FALSE(t);
        continue;
      }
      const std::string tn = tenant_ring.front();
      const std::string sn = session_ring[tn].front();
      const auto it = std::ranges::find_if(
          live, [&](const RefEntry& e) { return e.tenant == tn && e.session == sn; });
      ASSERT_TRUE(t);
      ASSERT_EQ(static_cast<uint64_t>(*t), it->id) << "step " << step;
      tenant_ring.pop_front();
      tenant_ring.push_back(tn);
      session_ring[tn].pop_front();
      session_ring[tn].push_back(sn);
      erase_ref(it->id);
    } else if (op < 9) {
      if (live.empty()) continue;
      const uint64_t id = live[rng() % live.size()].id;
      ASSERT_TRUE(q.remove(static_cast<Ticket>(id)));
      erase_ref(id);
    } else {
      std::vector<Ticket> expected;
      for (const RefEntry& e : live) {
        if (now - e.at >= kWait) expected.push_back(static_cast<Ticket>(e.id));
      }
      ASSERT_EQ(q.expired(now), expected);
      for (Ticket t : expected) erase_ref(static_cast<uint64_t>(t));
    }
    ASSERT_EQ(q.size(), static_cast<int64_t>(live.size()));
  }
}

}  // namespace
}  // namespace strata::router
