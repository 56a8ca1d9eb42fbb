// The metrics endpoint served over HTTP from a binary that links what the
// worker links (cuBLAS, cuBLASLt, cudart and NCCL in the CUDA build, whose
// static TLS outgrows civetweb's fixed thread stack), and timed events as
// metrics with a worker's labels.

#include "common/metrics.h"

#include <arpa/inet.h>
#include <link.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/timed_event.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

// The whole HTTP/1.0 response to GET `path` on 127.0.0.1:`port`, or "" when
// the connection fails.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
  close(fd);
  return response;
}

bool Loaded(const char* name) {
  struct Find {
    const char* name;
    bool found = false;
  } find{name};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* f = static_cast<Find*>(data);
        f->found |= std::string(info->dlpi_name).find(f->name) != std::string::npos;
        return 0;
      },
      &find);
  return find.found;
}

TEST(MetricsServerTest, ServesMetricsOverHttpInAProcessLinkingCuda) {
#ifdef PS_WITH_CUDA
  ASSERT_TRUE(Loaded("libcublasLt.so")) << "the CUDA build should load cuBLASLt";
#endif
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  prometheus::BuildCounter()
      .Name("ps_test_things_total")
      .Help("Things")
      .Register((*server)->registry())
      .Add({{"rank", "0"}})
      .Increment(7);
  const std::string response = HttpGet((*server)->port(), "/metrics");
  EXPECT_NE(response.find(" 200 OK"), std::string::npos) << response;
  EXPECT_NE(response.find("ps_test_things_total{rank=\"0\"} 7"), std::string::npos) << response;
}

TEST(MetricsServerTest, ABusyPortIsUnavailable) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> first = MetricsServer::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

TEST(EventMetricsTest, EventsCarryTheLabelsGiven) {
  prometheus::Registry registry;
  EventMetrics rank0(registry, "ps_test", {{"rank", "0"}});
  EventMetrics rank1(registry, "ps_test", {{"rank", "1"}});
  TimedEvent compute;
  compute.kind = EventKind::kCompute;
  compute.end_ns = 2000000;  // 2 ms
  rank0.OnEvent(compute);
  rank0.OnEvent(compute);
  rank1.OnEvent(compute);
  TimedEvent push;
  push.kind = EventKind::kPushMessage;
  push.lane = RpcLane(0);
  push.end_ns = 1000;
  push.bytes = 4096;
  rank1.OnEvent(push);
  compute.lane = DeviceLane(0);  // a device's compute: not a step phase
  rank1.OnEvent(compute);

  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::string key = family.name;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        absl::StrAppend(&key, ",", label.name, "=", label.value);
      }
      values[key] = family.type == prometheus::MetricType::Histogram
                        ? static_cast<double>(metric.histogram.sample_count)
                        : metric.counter.value;
    }
  }
  EXPECT_EQ(values["ps_test_phase_seconds,phase=compute,rank=0"], 2);
  EXPECT_EQ(values["ps_test_phase_seconds,phase=compute,rank=1"], 1);
  EXPECT_EQ(values["ps_test_rpc_bytes_total,kind=push_message,rank=1"], 4096);
  EXPECT_EQ(values["ps_test_rpc_seconds,kind=push_message,rank=1"], 1);
  EXPECT_EQ(values["ps_test_events_total,kind=compute,rank=1"], 2);
  EXPECT_EQ(values.count("ps_test_rpc_bytes_total,kind=push_message,rank=0"), 0);
}

}  // namespace
}  // namespace ps
