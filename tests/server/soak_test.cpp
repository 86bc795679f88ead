// Bounded soak over loopback: 500 requests from 8 concurrent clients, every fifth one streamed and
// abandoned after its first chunk. The server must not crash, must end with every slot free and
// an empty queue, and its RSS must stay within 10% between the 100th and the 500th request.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "server_harness.h"

namespace hyspec::test {
namespace {

using json = nlohmann::json;

TEST(HttpSoak, FiveHundredRequestsWithDisconnectsLeakNoSlotsAndKeepRssStable) {
  constexpr int kRequests = 500, kClients = 8;
  ServerProcess server({"-m", tiny_model("q8_0"), "--parallel", "8", "--queue", "16", "--threads", "1", "-c", "512"});
  ASSERT_TRUE(server.ready());

  std::atomic<int> next{0}, completed{0}, failures{0}, disconnects{0};
  std::mutex mu;
  long rss_at_100 = -1;
  std::string first_failure;
  const auto worker = [&] {
    auto c = server.client(30);
    for (int i; (i = next.fetch_add(1)) < kRequests;) {
      const std::string prompt = "Request number " + std::to_string(i) + " says hello";
      HttpReply r;
      bool ok = false;
      if (i % 5 == 0) {  // streamed, abandoned after the first chunk
        r = post_stream(c, "/v1/completions",
                        json{{"prompt", prompt}, {"max_tokens", 200}, {"ignore_eos", true}, {"stream", true}}.dump(),
                        [](const std::string& so_far) { return so_far.find("\"text\"") == std::string::npos; });
        ok = r.status == 200;
        ++disconnects;
      } else if (i % 5 == 1) {  // streamed to the end
        r = post_stream(c, "/v1/chat/completions",
                        json{{"messages", {{{"role", "user"}, {"content", prompt}}}}, {"max_tokens", 6}, {"stream", true},
                             {"stream_options", {{"include_usage", true}}}}.dump(),
                        nullptr);
        ok = r.status == 200 && r.body.ends_with("data: [DONE]\n\n");
      } else {
        r = post_json(c, i % 2 ? "/v1/chat/completions" : "/v1/completions",
                      i % 2 ? json{{"messages", {{{"role", "user"}, {"content", prompt}}}}, {"max_tokens", 6}}.dump()
                            : json{{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0.7}}.dump());
        ok = r.status == 200 && r.json.contains("usage");
      }
      if (!ok) {
        ++failures;
        std::lock_guard<std::mutex> lock(mu);
        if (first_failure.empty()) first_failure = "request " + std::to_string(i) + ": " + std::to_string(r.status) + " " + r.body;
      }
      if (++completed == 100) {
        std::lock_guard<std::mutex> lock(mu);
        rss_at_100 = server.rss_kib();
      }
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int k = 0; k < kClients; ++k) clients.emplace_back(worker);
  for (auto& t : clients) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  EXPECT_EQ(server.exited_status(), -1) << "the server died:\n" << server.output();
  EXPECT_EQ(failures.load(), 0) << first_failure;
  EXPECT_EQ(completed.load(), kRequests);
  EXPECT_EQ(wait_for_metric(server, "hyspec_active_slots", 0, 10), 0) << "leaked slots";
  EXPECT_EQ(server_metric(server, "hyspec_queue_depth"), 0);
  double finished = 0;
  for (const char* reason : {"stop", "length", "cancelled"})
    finished += std::max(0.0, server_metric(server, std::string("hyspec_requests_finished_total{reason=\"") + reason + "\"}"));
  EXPECT_EQ(finished, kRequests);
  EXPECT_GT(server_metric(server, "hyspec_requests_finished_total{reason=\"cancelled\"}"), 0);
  EXPECT_EQ(server_metric(server, "hyspec_requests_finished_total{reason=\"error\"}"), -1) << "no request failed";

  const long rss_at_500 = server.rss_kib();
  ASSERT_GT(rss_at_100, 0);
  ASSERT_GT(rss_at_500, 0);
  const double growth = static_cast<double>(rss_at_500 - rss_at_100) / static_cast<double>(rss_at_100);
  EXPECT_LT(std::abs(growth), 0.10) << "RSS " << rss_at_100 << " KiB after 100 requests, " << rss_at_500 << " KiB after 500";
  std::printf("soak: %d requests (%d abandoned) in %.1f s; RSS %ld -> %ld KiB (%+.1f%%)\n", kRequests, disconnects.load(),
              seconds, rss_at_100, rss_at_500, 100 * growth);
  EXPECT_EQ(server.stop(30), 0) << server.output();
}

}  // namespace
}  // namespace hyspec::test
