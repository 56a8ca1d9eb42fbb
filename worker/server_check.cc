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

// The verdict lines of one CheckServer: Pass records a step that went
// through; Fail records one that did not, with how to fix it, and returns
// false so that a step can `return Fail(...)`.
void Pass(const std::string& what, ServerCheckResult* result) {
  result->lines.push_back(absl::StrCat("ok: ", what));
}
bool Fail(const std::string& what, const std::string& fix, ServerCheckResult* result) {
  result->lines.push_back(absl::StrCat("FAIL: ", what, " -- ", fix));
  return false;
}

using AddrInfoPtr = std::unique_ptr<addrinfo, void (*)(addrinfo*)>;

// Step 1. The addresses `address` (host:port) resolves to; null after a
// FAIL line when it is malformed or does not resolve.
AddrInfoPtr Resolve(const std::string& address, ServerCheckResult* result) {
  AddrInfoPtr none(nullptr, freeaddrinfo);
  std::string host, port;
  if (!SplitAddress(address, &host, &port)) {
    Fail(absl::StrCat("'", address, "' is not host:port"),
         "give --server as host:port, e.g. 10.0.0.5:50051 or server:50051", result);
    return none;
  }
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* info = nullptr;
  if (const int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &info); gai != 0) {
    Fail(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(gai)),
         "check the name; in Compose or Kubernetes use the server's service name", result);
    return none;
  }
  AddrInfoPtr owned(info, freeaddrinfo);
  Pass(absl::StrCat(host, " resolves"), result);
  return owned;
}

// Step 2. Whether TCP to the first of `info` connects within the timeout.
bool CheckTcp(const ServerCheckOptions& options, const addrinfo* info,
              ServerCheckResult* result) {
  if (const std::string error = TcpConnect(info, options.timeout); !error.empty()) {
    return Fail(absl::StrCat("TCP to ", options.address, ": ", error),
                absl::StrCat("is the server running and listening there? It binds 127.0.0.1 "
                             "unless given --bind_address (0.0.0.0 in a container); a firewall "
                             "or a wrong port looks the same"),
                result);
  }
  Pass(absl::StrCat("TCP connects to ", options.address), result);
  return true;
}

// A channel to the server as this worker would open it; null after a FAIL
// line when the TLS settings are unusable.
std::shared_ptr<grpc::Channel> OpenChannel(const ServerCheckOptions& options,
                                           ServerCheckResult* result) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options.tls);
  if (!credentials.ok()) {
    Fail(std::string(credentials.status().message()), "fix the --tls_* flags", result);
    return nullptr;
  }
  grpc::ChannelArguments args;
  AddTlsChannelArgs(options.tls, &args);
  return grpc::CreateCustomChannel(options.address, *credentials, args);
}

// One Describe with the job token, within the timeout.
grpc::Status Describe(const ServerCheckOptions& options, proto::ParameterServer::Stub* stub,
                      proto::DescribeReply* reply) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  if (!options.job_token.empty()) context.AddMetadata(kJobTokenMetadataKey, options.job_token);
  return stub->Describe(&context, proto::DescribeRequest(), reply);
}

// Step 3. Whether the server answers Describe through the TLS settings and
// the token; its answer in `job`.
bool CheckDescribe(const ServerCheckOptions& options, proto::ParameterServer::Stub* stub,
                   proto::DescribeReply* job, ServerCheckResult* result) {
  const grpc::Status status = Describe(options, stub, job);
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return Fail(absl::StrCat("the server refuses the job token: ", status.error_message()),
                "give the job's token with --job_token_file or $PS_JOB_TOKEN", result);
  }
  if (!status.ok()) {
    const bool tls = UsesTls(options.tls);
    return Fail(
        absl::StrCat("TCP connects but gRPC does not answer (", status.error_message(), ")"),
        tls ? "the TLS settings disagree: --tls_ca must be the CA that signed the server's "
              "certificate, whose names must include the host you dial (or "
              "--tls_server_name); a server with --tls_client_ca needs --tls_cert/--tls_key "
              "signed by it"
            : "the server may require TLS: give --tls_ca (and --tls_cert/--tls_key for mutual "
              "TLS); or it is not a parameter server",
        result);
  }
  Pass(absl::StrCat("the server answers", UsesTls(options.tls) ? " over TLS" : "",
                    options.job_token.empty() ? "" : " and takes the job token", ": ",
                    job->registered(), " of ", job->num_workers(),
                    " workers registered, version ", job->version(),
                    job->initialized() ? "" : " (initial parameters not in yet)"),
       result);
  return true;
}

// The model the server's job holds (empty: no worker has stated it yet).
std::vector<ParamSpec> SignatureOf(const proto::DescribeReply& job) {
  std::vector<ParamSpec> signature;
  for (const proto::TensorSpec& t : job.signature()) {
    ParamSpec spec;
    spec.name = t.name();
    spec.shape.assign(t.shape().begin(), t.shape().end());
    signature.push_back(std::move(spec));
  }
  return signature;
}

// Step 4. Whether the server's model (`server_signature`) and steps per
// epoch agree with this worker's, where the options state them.
bool CheckModel(const ServerCheckOptions& options, const proto::DescribeReply& job,
                const std::vector<ParamSpec>& server_signature, ServerCheckResult* result) {
  if (!options.signature.empty()) {
    if (server_signature.empty()) {
      Pass("no worker has stated the model yet: this one would", result);
    } else if (const std::string diff = FirstDifference(server_signature, options.signature);
               !diff.empty()) {
      return Fail(absl::StrCat("the server's model differs: ", diff),
                  "start every worker with the same --model (and --mlp_hidden), or point this "
                  "one at its own job's server",
                  result);
    } else {
      Pass(absl::StrCat("the model matches (", server_signature.size(), " tensors)"), result);
    }
  }
  if (options.steps_per_epoch > 0 && job.steps_per_epoch() >= 0 &&
      job.steps_per_epoch() != options.steps_per_epoch) {
    return Fail(absl::StrCat("the job has ", job.steps_per_epoch(),
                             " steps per epoch, this worker ", options.steps_per_epoch),
                "give every worker the same dataset and --batch_size", result);
  }
  return true;
}

// Step 5a. The median of up to ten Describe round trips (stopping at the
// first that fails), when any went through.
void MeasureRoundTrip(const ServerCheckOptions& options, proto::ParameterServer::Stub* stub,
                      ServerCheckResult* result) {
  std::vector<double> ms;
  for (int i = 0; i < 10; ++i) {
    const absl::Time start = absl::Now();
    proto::DescribeReply reply;
    if (!Describe(options, stub, &reply).ok()) break;
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  if (!ms.empty()) {
    std::sort(ms.begin(), ms.end());
    Pass(absl::StrFormat("round trip %.2f ms (median of %d)", ms[ms.size() / 2],
                         static_cast<int>(ms.size())),
         result);
  }
}

// One pull of `pull` with the job token, within the timeout: the reply's
// bytes, or -1 when it failed.
int64_t PullOnce(const ServerCheckOptions& options, const proto::PullRequest& pull,
                 grpc::GenericStub* generic) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  if (!options.job_token.empty()) {
    context.AddMetadata(kJobTokenMetadataKey, options.job_token);
  }
  const grpc::ByteBuffer request = proto::SerializeMessage(pull);
  grpc::ByteBuffer reply;
  grpc::Status s;
  absl::Notification done;
  generic->UnaryCall(&context, proto::kPullMethod, grpc::StubOptions(), &request, &reply,
                     [&](grpc::Status got) {
                       s = std::move(got);
                       done.Notify();
                     });
  done.WaitForNotification();
  if (!s.ok()) return -1;
  return static_cast<int64_t>(reply.Length());
}

// Step 5b. The pull speed of the largest tensor's first chunk, as a
// worker's pull would ask, five times (stopping at the first that fails),
// when any bytes came back. Needs the initial parameters on the server.
void MeasurePull(const ServerCheckOptions& options, const std::shared_ptr<grpc::Channel>& channel,
                 const std::vector<ParamSpec>& server_signature, ServerCheckResult* result) {
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
    const int64_t got = PullOnce(options, pull, &generic);
    if (got < 0) break;
    bytes += got;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (bytes > 0 && seconds > 0) {
    Pass(absl::StrFormat("pulls %.1f MB/s (%lld bytes of '%s' five times)", bytes / seconds / 1e6,
                         static_cast<long long>(bytes / 5), server_signature[key].name),
         result);
  }
}

}  // namespace

ServerCheckResult CheckServer(const ServerCheckOptions& options) {
  ServerCheckResult result;
  // 1. The name.
  const AddrInfoPtr info = Resolve(options.address, &result);
  if (info == nullptr) return result;
  // 2. TCP.
  if (!CheckTcp(options, info.get(), &result)) return result;
  // 3. gRPC through the TLS settings and the token: Describe.
  const std::shared_ptr<grpc::Channel> channel = OpenChannel(options, &result);
  if (channel == nullptr) return result;
  const auto stub = proto::ParameterServer::NewStub(channel);
  proto::DescribeReply job;
  if (!CheckDescribe(options, stub.get(), &job, &result)) return result;
  // 4. The model.
  const std::vector<ParamSpec> server_signature = SignatureOf(job);
  if (!CheckModel(options, job, server_signature, &result)) return result;
  // 5. Round trip and pull speed.
  MeasureRoundTrip(options, stub.get(), &result);
  if (job.initialized() && !server_signature.empty()) {
    MeasurePull(options, channel, server_signature, &result);
  }
  result.ok = true;
  return result;
}

}  // namespace ps::worker
