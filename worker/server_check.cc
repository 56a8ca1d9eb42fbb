#include "worker/server_check.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/job_token.h"
#include "common/tensor.h"
#include "proto/parameter_server.grpc.pb.h"
#include "proto/wire_format.h"

namespace ps::worker {
namespace {

// host and port of "host:port" or "[v6]:port"; false if malformed.
bool SplitAddress(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 >= address.size()) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !host->empty();
}

// "" when a TCP connection to the first address of `info` opens within
// `timeout`, else what happened.
std::string TcpConnect(const addrinfo* info, absl::Duration timeout) {
  const int fd = socket(info->ai_family, info->ai_socktype | SOCK_NONBLOCK, info->ai_protocol);
  if (fd < 0) return absl::StrCat("socket: ", std::strerror(errno));
  std::string error;
  if (connect(fd, info->ai_addr, info->ai_addrlen) != 0 && errno != EINPROGRESS) {
    error = std::strerror(errno);
  } else {
    pollfd p = {fd, POLLOUT, 0};
    const int ready = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
    if (ready == 0) {
      error = absl::StrCat("no answer within ", absl::FormatDuration(timeout));
    } else {
      int so_error = 0;
      socklen_t len = sizeof(so_error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
      if (so_error != 0) error = std::strerror(so_error);
    }
  }
  close(fd);
  return error;
}

std::string FirstDifference(const std::vector<ParamSpec>& server,
                            const std::vector<ParamSpec>& ours) {
  for (size_t i = 0; i < std::min(server.size(), ours.size()); ++i) {
    if (server[i].name != ours[i].name) {
      return absl::StrCat("parameter ", i, " is '", server[i].name, "' on the server, '",
                          ours[i].name, "' here");
    }
    if (server[i].shape != ours[i].shape) {
      return absl::StrCat("'", ours[i].name, "' has shape ", ShapeToString(server[i].shape),
                          " on the server, ", ShapeToString(ours[i].shape), " here");
    }
  }
  if (server.size() != ours.size()) {
    return absl::StrCat("the server's model has ", server.size(), " parameters, this one ",
                        ours.size());
  }
  return "";
}

}  // namespace

ServerCheckResult CheckServer(const ServerCheckOptions& options) {
  ServerCheckResult result;
  auto fail = [&](const std::string& what, const std::string& fix) {
    result.lines.push_back(absl::StrCat("FAIL: ", what, " -- ", fix));
    return result;
  };
  auto ok = [&](const std::string& what) { result.lines.push_back(absl::StrCat("ok: ", what)); };

  // 1. The name.
  std::string host, port;
  if (!SplitAddress(options.address, &host, &port)) {
    return fail(absl::StrCat("'", options.address, "' is not host:port"),
                "give --server as host:port, e.g. 10.0.0.5:50051 or server:50051");
  }
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* info = nullptr;
  if (const int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &info); gai != 0) {
    return fail(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(gai)),
                "check the name; in Compose or Kubernetes use the server's service name");
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(info, freeaddrinfo);
  ok(absl::StrCat(host, " resolves"));

  // 2. TCP.
  if (const std::string error = TcpConnect(info, options.timeout); !error.empty()) {
    return fail(absl::StrCat("TCP to ", options.address, ": ", error),
                absl::StrCat("is the server running and listening there? It binds 127.0.0.1 "
                             "unless given --bind_address (0.0.0.0 in a container); a firewall "
                             "or a wrong port looks the same"));
  }
  ok(absl::StrCat("TCP connects to ", options.address));

  // 3. gRPC through the TLS settings and the token: Describe.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options.tls);
  if (!credentials.ok()) {
    return fail(std::string(credentials.status().message()), "fix the --tls_* flags");
  }
  grpc::ChannelArguments args;
  AddTlsChannelArgs(options.tls, &args);
  auto channel = grpc::CreateCustomChannel(options.address, *credentials, args);
  auto stub = proto::ParameterServer::NewStub(channel);
  auto describe = [&](proto::DescribeReply* reply) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
    if (!options.job_token.empty()) context.AddMetadata(kJobTokenMetadataKey, options.job_token);
    return stub->Describe(&context, proto::DescribeRequest(), reply);
  };
  proto::DescribeReply job;
  const grpc::Status status = describe(&job);
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return fail(absl::StrCat("the server refuses the job token: ", status.error_message()),
                "give the job's token with --job_token_file or $PS_JOB_TOKEN");
  }
  if (!status.ok()) {
    const bool tls = UsesTls(options.tls);
    return fail(
        absl::StrCat("TCP connects but gRPC does not answer (", status.error_message(), ")"),
        tls ? "the TLS settings disagree: --tls_ca must be the CA that signed the server's "
              "certificate, whose names must include the host you dial (or "
              "--tls_server_name); a server with --tls_client_ca needs --tls_cert/--tls_key "
              "signed by it"
            : "the server may require TLS: give --tls_ca (and --tls_cert/--tls_key for mutual "
              "TLS); or it is not a parameter server");
  }
  ok(absl::StrCat("the server answers", UsesTls(options.tls) ? " over TLS" : "",
                  options.job_token.empty() ? "" : " and takes the job token", ": ",
                  job.registered(), " of ", job.num_workers(), " workers registered, version ",
                  job.version(), job.initialized() ? "" : " (initial parameters not in yet)"));

  // 4. The model.
  std::vector<ParamSpec> server_signature;
  for (const proto::TensorSpec& t : job.signature()) {
    ParamSpec spec;
    spec.name = t.name();
    spec.shape.assign(t.shape().begin(), t.shape().end());
    server_signature.push_back(std::move(spec));
  }
  if (!options.signature.empty()) {
    if (server_signature.empty()) {
      ok("no worker has stated the model yet: this one would");
    } else if (const std::string diff = FirstDifference(server_signature, options.signature);
               !diff.empty()) {
      return fail(absl::StrCat("the server's model differs: ", diff),
                  "start every worker with the same --model (and --mlp_hidden), or point this "
                  "one at its own job's server");
    } else {
      ok(absl::StrCat("the model matches (", server_signature.size(), " tensors)"));
    }
  }
  if (options.steps_per_epoch > 0 && job.steps_per_epoch() >= 0 &&
      job.steps_per_epoch() != options.steps_per_epoch) {
    return fail(absl::StrCat("the job has ", job.steps_per_epoch(),
                             " steps per epoch, this worker ", options.steps_per_epoch),
                "give every worker the same dataset and --batch_size");
  }

  // 5. Round trip and pull speed.
  std::vector<double> ms;
  for (int i = 0; i < 10; ++i) {
    const absl::Time start = absl::Now();
    proto::DescribeReply reply;
    if (!describe(&reply).ok()) break;
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  if (!ms.empty()) {
    std::sort(ms.begin(), ms.end());
    ok(absl::StrFormat("round trip %.2f ms (median of %d)", ms[ms.size() / 2],
                       static_cast<int>(ms.size())));
  }
  if (job.initialized() && !server_signature.empty()) {
    // The largest tensor's first chunk, as a worker's pull would ask.
    int key = 0;
    int64_t largest = -1;
    for (int k = 0; k < static_cast<int>(server_signature.size()); ++k) {
      const int64_t n = NumElements(server_signature[k].shape);
      if (n > largest) largest = n, key = k;
    }
    proto::PullRequest pull;
    pull.set_version(0);
    proto::ChunkId* id = pull.add_chunks();
    id->set_key(key);
    id->set_chunk(0);
    grpc::GenericStub generic(channel);
    int64_t bytes = 0;
    const absl::Time start = absl::Now();
    for (int i = 0; i < 5; ++i) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
      if (!options.job_token.empty()) {
        context.AddMetadata(kJobTokenMetadataKey, options.job_token);
      }
      const grpc::ByteBuffer request = proto::SerializeMessage(pull);
      grpc::ByteBuffer reply;
      grpc::Status s;
      absl::Notification done;
      generic.UnaryCall(&context, proto::kPullMethod, grpc::StubOptions(), &request, &reply,
                        [&](grpc::Status got) {
                          s = std::move(got);
                          done.Notify();
                        });
      done.WaitForNotification();
      if (!s.ok()) break;
      bytes += static_cast<int64_t>(reply.Length());
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (bytes > 0 && seconds > 0) {
      ok(absl::StrFormat("pulls %.1f MB/s (%lld bytes of '%s' five times)", bytes / seconds / 1e6,
                         static_cast<long long>(bytes / 5), server_signature[key].name));
    }
  }
  result.ok = true;
  return result;
}

}  // namespace ps::worker
