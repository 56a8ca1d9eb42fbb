// A seeded mutation fuzzer for the service's request handlers, through the
// real wire: a ParameterServer in a known mid-iteration state behind its
// ParameterServerService on 127.0.0.1:0, and a flood of hostile requests
// (mutations of valid messages of every method, 64 in flight) from a
// grpc::GenericStub in the same process.
//
// Each input is judged before it is sent by an oracle that knows the
// server's state and the contract of parameter_server.proto (not the
// handlers' code): the codes its faults may be answered with (the reply must
// carry one of them: the contract orders no checks but the job token's and
// the framing's), or OK and what the reply must hold, or "would change the
// state legitimately" (a push with its rank's session that the contract
// accepts, a worker's re-registration), which is not sent: the state must
// not move, so that every reply can be judged against one snapshot and,
// afterwards, the parameters, held early parts, pending sums and
// registrations checked unchanged (the pending sums by completing the
// iteration and comparing, bit for bit, with a reference server that got the
// same legitimate pushes and no flood). Credentials are fuzzed too: the job
// token, and the session on every call.
//
// The faults the flood found in the service are fixed, each with a
// regression test at the end: INTERNAL for an unparsable Register, Wait or
// Heartbeat body, a Register refusal echoing a huge string past gRPC's
// status metadata (which broke every call on its connection; such requests
// still go on a connection of their own), a pull of one chunk a million
// times, and sample counts overflowing the sum.
//
// Deterministic: input i is a function of (seed, i) alone (its own
// std::mt19937_64), whatever order the replies come back in, so a reported
// index reproduces one input. The seed is printed; PS_FUZZ_SEED overrides it
// (bazel test --test_env=PS_FUZZ_SEED=...).

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/half.h"
#include "common/wire_codec.h"
#include "common/cpu_device.h"
#include "common/job_token.h"
#include "common/param_spec.h"
#include "gtest/gtest.h"
#include "proto/parameter_server.pb.h"
#include "proto/wire_format.h"
#include "server/grpc_service.h"
#include "common/push_checks.h"
#include "server/parameter_server.h"
#include "server/parameter_server_testing.h"

namespace ps::server {
namespace {

// ---------------------------------------------------------------------------
// The job: 2 workers, 3 tensors cut into 5 chunks of at most 4 elements.

constexpr int kNumWorkers = 2;
constexpr int64_t kChunkElements = 4;
constexpr int64_t kStepsPerEpoch = 10;
// The flood runs at version 2, in the middle of iteration 2.
constexpr int64_t kVersion = 2;
// Each worker's samples per push (different, so a wrong count is caught).
constexpr int64_t kSamples[kNumWorkers] = {8, 6};
const char* const kWorkerIds[kNumWorkers] = {"w0", "w1"};

// The plain protobuf methods, on the generated service's names.
constexpr char kRegisterMethod[] = "/ps.proto.ParameterServer/Register";
constexpr char kWaitMethod[] = "/ps.proto.ParameterServer/Wait";
constexpr char kHeartbeatMethod[] = "/ps.proto.ParameterServer/Heartbeat";
constexpr char kDescribeMethod[] = "/ps.proto.ParameterServer/Describe";
constexpr char kRestoreMethod[] = "/ps.proto.ParameterServer/Restore";

// gRPC's default receive limit, which the proto says no message needs raised.
constexpr size_t kMaxMessageBytes = size_t{4} << 20;

// Inputs sent (not counting those the oracle keeps back), and how many are in
// flight at once. Measured on 2 cores: see the printed rate.
constexpr int64_t kInputs = 100000;
constexpr int kMaxInFlight = 64;
// Calls the oracle expects to wait out a timeout longer than a few
// milliseconds get slots of their own, so that they cannot starve the rest.
constexpr int kMaxWaitingInFlight = 256;
constexpr uint64_t kDefaultSeed = 0x70a57e5eedf022ULL;

// w: 10 elements in chunks of 4, 4, 2; b: one chunk of 3; e: an empty
// tensor, still one (empty) chunk.
std::vector<ParamSpec> Signature() {
  return {{"w", {2, 5}, DType::kF32}, {"b", {3}, DType::kF32}, {"e", {0}, DType::kF32}};
}

// The test's own view of the layout (parameter_server.proto: chunk c of key
// k covers elements [c * chunk_elements, ...)), independent of the server's.
struct Layout {
  std::vector<ParamSpec> signature;
  std::vector<int64_t> first_chunk, num_chunks;  // per key
  std::vector<int> key;                          // per global chunk
  std::vector<int64_t> chunk, offset, length;    // per global chunk
  int64_t num_parameters = 0;

  explicit Layout(std::vector<ParamSpec> spec) : signature(std::move(spec)) {
    for (size_t k = 0; k < signature.size(); ++k) {
      const int64_t n = NumElements(signature[k].shape);
      first_chunk.push_back(static_cast<int64_t>(key.size()));
      num_chunks.push_back(ChunkCount(n, kChunkElements));
      for (int64_t c = 0; c < num_chunks.back(); ++c) {
        key.push_back(static_cast<int>(k));
        chunk.push_back(c);
        offset.push_back(num_parameters + c * kChunkElements);
        length.push_back(std::min(kChunkElements, n - c * kChunkElements));
      }
      num_parameters += n;
    }
  }
  int64_t total_chunks() const { return static_cast<int64_t>(key.size()); }
  // The global index of chunk `c` of key `k`, or -1 when either is out of range.
  int64_t Global(int64_t k, int64_t c) const {
    if (k < 0 || k >= static_cast<int64_t>(signature.size())) return -1;
    if (c < 0 || c >= num_chunks[k]) return -1;
    return first_chunk[k] + c;
  }
};

// The job's shared secret (parameter_server.proto, "Credentials").
constexpr char kJobToken[] = "fuzz-job-token-0123456789abcdef";

// What the flood must leave as it is, and what the oracle judges against.
struct Model {
  Layout layout{Signature()};
  // [rank][global chunk]: pushed by that worker in iteration kVersion.
  std::vector<std::vector<bool>> pushed;
  // Per global chunk: its published version.
  std::vector<int64_t> chunk_version;
  // Flat, as Pull copies them (a chunk already updated in iteration 2 at
  // version 3).
  std::vector<float> params;
  // Flat, at each whole version before this one ([v]), for exact pulls.
  std::map<int64_t, std::vector<float>> params_at;
  // The server process's incarnation and each rank's session credential,
  // and a session of another incarnation (the reference server's).
  std::string incarnation;
  std::vector<std::string> sessions;
  std::string foreign_session;
};

// ---------------------------------------------------------------------------
// The legitimate pushes: deterministic gradients, one message per step of
// the plan, the same on the fuzzed server and on the reference.

struct PlannedPush {
  int rank;
  int64_t iteration;
  std::vector<int64_t> global_chunks;
};

// Iterations 0 and 1 whole (iteration 1 in reverse rank order, so early
// parts were held and released), then half of iteration 2: rank 0 pushes
// w:0, w:1 and b:0 (pending sums of one rank), rank 1 pushes w:1 (which
// completes it: applied, chunk version 3), w:2 (held early: rank 0 has not
// pushed it) and the empty e:0.
std::vector<PlannedPush> PlanBeforeFlood() {
  return {{0, 0, {0, 1, 2, 3, 4}}, {1, 0, {0, 1, 2, 3, 4}}, {1, 1, {4, 3, 2, 1, 0}},
          {0, 1, {0, 1, 2, 3, 4}}, {0, 2, {0, 1, 3}},       {1, 2, {1, 2, 4}}};
}
// The rest of iteration 2, then iteration 3 whole.
std::vector<PlannedPush> PlanAfterFlood() {
  return {{1, 2, {0, 3}}, {0, 2, {2, 4}}, {1, 3, {0, 1, 2, 3, 4}}, {0, 3, {0, 1, 2, 3, 4}}};
}

float Gradient(int rank, int64_t iteration, int64_t element) {
  return 0.03125f * static_cast<float>((element * 7 + rank * 3 + iteration * 5) % 11) - 0.15625f;
}

absl::Status Push(ParameterServer& server, const Layout& layout, const PlannedPush& push) {
  std::vector<std::vector<float>> gradients(push.global_chunks.size());
  std::vector<ChunkData> chunks;
  for (size_t i = 0; i < push.global_chunks.size(); ++i) {
    const int64_t gc = push.global_chunks[i];
    for (int64_t e = 0; e < layout.length[gc]; ++e) {
      gradients[i].push_back(Gradient(push.rank, push.iteration, layout.offset[gc] + e));
    }
    chunks.push_back({layout.key[gc], layout.chunk[gc], gradients[i]});
  }
  return PushChunks(server, push.rank, push.iteration, kSamples[push.rank], chunks);
}

// A server brought to the flood's state, with what its setup saw.
struct Job {
  std::unique_ptr<ParameterServer> server;
  std::vector<std::string> sessions;                // per rank
  std::map<int64_t, std::vector<float>> params_at;  // each whole version reached
};

// A worker's identity: its secret, which no mutation knows.
WorkerIdentity IdentityOf(const std::string& id) {
  WorkerIdentity identity;
  identity.vouched = false;
  identity.proof = id + "'s secret, unguessed";
  return identity;
}

absl::StatusOr<Job> StartJob(CpuDevice* device) {
  ParameterServerOptions options;
  options.num_workers = kNumWorkers;
  options.chunk_elements = kChunkElements;
  options.optimizer.sgd.lr = 0.25f;
  options.optimizer.sgd.momentum = 0.875f;  // the momentum buffer is state too
  options.optimizer.sgd.weight_decay = 0.0625f;
  std::vector<float> initial;
  for (int64_t i = 0; i < Layout(Signature()).num_parameters; ++i) {
    initial.push_back(0.125f * static_cast<float>(i) - 0.5f);
  }
  auto server = ParameterServer::Create(options, Signature(), std::move(initial), device);
  if (!server.ok()) return server.status();
  Job job;
  job.server = std::move(server).value();
  for (int r = 0; r < kNumWorkers; ++r) {
    auto reg = job.server->Register(kWorkerIds[r], Signature(), r, kStepsPerEpoch,
                                    IdentityOf(kWorkerIds[r]));
    if (!reg.ok()) return reg.status();
    job.sessions.push_back(reg->session);
  }
  const Layout layout(Signature());
  auto record = [&] {
    std::vector<float>& out = job.params_at[job.server->version()];
    out.resize(layout.num_parameters);
    return Pull(*job.server, job.server->version(), absl::InfiniteFuture(), absl::MakeSpan(out))
        .status();
  };
  if (absl::Status s = record(); !s.ok()) return s;
  for (const PlannedPush& push : PlanBeforeFlood()) {
    const int64_t version = job.server->version();
    if (absl::Status s = Push(*job.server, layout, push); !s.ok()) return s;
    if (job.server->version() != version) {
      if (absl::Status s = record(); !s.ok()) return s;
    }
  }
  // Version 2's record is taken at once when iteration 1 completes, before
  // iteration 2 touched any chunk; the current values are the snapshot's.
  return job;
}

// ---------------------------------------------------------------------------
// Status codes as bit sets.

using Codes = uint32_t;
constexpr Codes Bit(grpc::StatusCode code) { return Codes{1} << static_cast<int>(code); }
constexpr Codes kInvalidArgument = Bit(grpc::StatusCode::INVALID_ARGUMENT);
constexpr Codes kNotFound = Bit(grpc::StatusCode::NOT_FOUND);
constexpr Codes kOutOfRange = Bit(grpc::StatusCode::OUT_OF_RANGE);
constexpr Codes kFailedPrecondition = Bit(grpc::StatusCode::FAILED_PRECONDITION);
constexpr Codes kAlreadyExists = Bit(grpc::StatusCode::ALREADY_EXISTS);
constexpr Codes kResourceExhausted = Bit(grpc::StatusCode::RESOURCE_EXHAUSTED);
constexpr Codes kDeadlineExceeded = Bit(grpc::StatusCode::DEADLINE_EXCEEDED);
constexpr Codes kUnauthenticated = Bit(grpc::StatusCode::UNAUTHENTICATED);
constexpr Codes kPermissionDenied = Bit(grpc::StatusCode::PERMISSION_DENIED);
constexpr Codes kAborted = Bit(grpc::StatusCode::ABORTED);

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "?";
  }
}

std::string CodesString(Codes codes) {
  std::string out;
  for (int c = 0; c <= 16; ++c) {
    if (codes & (Codes{1} << c)) {
      absl::StrAppend(&out, out.empty() ? "" : "|", CodeName(static_cast<grpc::StatusCode>(c)));
    }
  }
  return out.empty() ? "(none)" : out;
}

// ---------------------------------------------------------------------------
// The oracle.

// One request as sent: its body and the credentials in its metadata
// (absent when unset; an empty value is sent as such).
struct Request {
  std::string bytes;
  std::optional<std::string> job_token;
  std::optional<std::string> session;
};

struct Expectation {
  enum class Outcome {
    kRefused,  // the reply must carry one of `codes`
    kOk,       // the reply must be OK and hold what the fields below say
    kNotSent,  // the contract accepts it and it would change the state
  };
  Outcome outcome = Outcome::kRefused;
  Codes codes = 0;
  // A body of a plain protobuf method (Register, Wait, Heartbeat) that does
  // not parse: INVALID_ARGUMENT (malformed message), from the service's own
  // parse (gRPC's generated handler said INTERNAL; see
  // UnparsableProtobufRequestsAreInvalidArgument).
  bool unparsable_protobuf = false;
  // Refused with DEADLINE_EXCEEDED after waiting this long (its timeout,
  // capped by the call's deadline).
  int64_t wait_ms = 0;
  std::string why;  // what the oracle saw (for kNotSent, and for reports)
  // kOk for a pull: per chunk asked for, in order, its global index and
  // the values it must carry; and the reply's version (Pull and Wait).
  std::vector<std::pair<int64_t, const float*>> pull_chunks;
  proto::DType pull_dtype = proto::DTYPE_F32;  // the reply's encoding
  int64_t reply_version = 0;
  // A Register whose strings (id, names, shape) add up to more than a
  // status message fits in gRPC's default 8 KiB of metadata: the server
  // once echoed them into its refusal, which the client could not receive
  // (see ARefusalNeverEchoesAnUnboundedString). Sent on a connection of its
  // own, so a regression breaks only that one.
  bool echoes_huge_strings = false;
};

Expectation Refused(Codes codes, std::string why) {
  Expectation e;
  e.outcome = Expectation::Outcome::kRefused;
  e.codes = codes;
  e.why = std::move(why);
  return e;
}
Expectation Ok(std::string why) {
  Expectation e;
  e.outcome = Expectation::Outcome::kOk;
  e.why = std::move(why);
  return e;
}
Expectation NotSent(std::string why) {
  Expectation e;
  e.outcome = Expectation::Outcome::kNotSent;
  e.why = std::move(why);
  return e;
}

uint32_t LittleEndian32(const std::string& bytes) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  return v;
}

// Reads `bytes` as a frame (parameter_server.proto's framing): false for any
// framing fault, which the proto makes INVALID_ARGUMENT. Otherwise `data`
// holds each chunk's bytes.
template <typename Header>
bool DecodeFrame(const std::string& bytes, Header* header, std::vector<absl::string_view>* data) {
  if (bytes.size() < proto::kFrameLengthBytes) return false;
  const uint64_t header_bytes = LittleEndian32(bytes);
  const uint64_t rest = bytes.size() - proto::kFrameLengthBytes;
  if (header_bytes > rest) return false;
  if (!header->ParseFromArray(bytes.data() + proto::kFrameLengthBytes,
                              static_cast<int>(header_bytes))) {
    return false;
  }
  uint64_t at = proto::kFrameLengthBytes + header_bytes;
  uint64_t left = rest - header_bytes;
  for (const proto::TensorChunk& chunk : header->chunks()) {
    if (!chunk.data().empty()) return false;
    if (chunk.data_bytes() < 0) return false;
    // A chunk in shared memory has no bytes in the frame.
    const uint64_t in_frame = chunk.in_shared_memory() ? 0 : chunk.data_bytes();
    if (in_frame > left) return false;
    data->push_back(absl::string_view(bytes).substr(at, in_frame));
    at += in_frame;
    left -= in_frame;
  }
  return left == 0;
}

// Bytes per element of a chunk's dtype on the wire (0: no codec sends it).
int64_t WireWidth(proto::DType dtype) {
  switch (dtype) {
    case proto::DTYPE_F32:
      return 4;
    case proto::DTYPE_F16:
    case proto::DTYPE_BF16:
      return 2;
    default:
      return 0;
  }
}

bool AllFinite(absl::string_view bytes, proto::DType dtype = proto::DTYPE_F32) {
  const int64_t width = WireWidth(dtype);
  for (size_t i = 0; i + width <= bytes.size(); i += width) {
    float f;
    if (width == 4) {
      std::memcpy(&f, bytes.data() + i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + i, 2);
      f = dtype == proto::DTYPE_F16 ? HalfToFloat(bits) : Bfloat16ToFloat(bits);
    }
    if (!std::isfinite(f)) return false;
  }
  return true;
}

bool Registered(int64_t rank) { return rank >= 0 && rank < kNumWorkers; }

// Whether `session` is this server process's (RegisterReply.session: the
// incarnation is its prefix, then "-" and the secret).
bool OurIncarnation(const Model& m, absl::string_view session) {
  return absl::StartsWith(session, absl::StrCat(m.incarnation, "-"));
}

// The code a push or initial value acting as `rank` with this session
// gets (parameter_server.proto, "Credentials"), 0 when it is rank's.
Codes SessionCodes(const Model& m, const std::optional<std::string>& session, int rank) {
  const std::string value = session.value_or("");
  if (!OurIncarnation(m, value)) return kAborted;  // none, or another process's
  if (!Registered(rank)) return kNotFound;
  return value == m.sessions[rank] ? 0 : kPermissionDenied;
}

// The per-chunk faults every framed request is checked for. Pushes may
// carry F16 and BF16 (--compression); initial values F32 only.
template <typename Header>
Codes ChunkTypeCodes(const Header& header, bool half_allowed) {
  Codes codes = 0;
  for (const proto::TensorChunk& chunk : header.chunks()) {
    if (chunk.in_shared_memory()) {
      // No session here has shared memory attached (no registration offers
      // a segment the server can map).
      codes |= kInvalidArgument;
      continue;
    }
    if (chunk.encoding() != proto::ENCODING_DENSE) {
      // Top-k pairs: pushes of F32 only; their contents are judged with the
      // chunk (JudgePush).
      if (chunk.encoding() != proto::ENCODING_TOPK || !half_allowed ||
          chunk.dtype() != proto::DTYPE_F32 || chunk.data_bytes() % 8 != 0) {
        codes |= kInvalidArgument;
      }
      continue;
    }
    const int64_t width = WireWidth(chunk.dtype());
    if (width == 0 || (width == 2 && !half_allowed)) {
      codes |= kInvalidArgument;
    } else if (chunk.data_bytes() % width != 0) {
      codes |= kInvalidArgument;
    }
  }
  return codes;
}

// Push: framing, then every fault the contract names, each with its code
// (the reply may name any of them: the contract orders none of them but
// framing). A push the contract accepts is not sent, except one of no
// chunks, which changes nothing and must be OK.
Expectation JudgePush(const Model& m, const Request& r) {
  proto::PushRequest header;
  std::vector<absl::string_view> data;
  if (!DecodeFrame(r.bytes, &header, &data)) return Refused(kInvalidArgument, "bad framing");
  const int rank = header.rank();
  Codes codes = ChunkTypeCodes(header, /*half_allowed=*/true) | SessionCodes(m, r.session, rank);
  if (!Registered(rank)) {
    codes |= kNotFound;
  } else {
    if (header.iteration() != kVersion) codes |= kFailedPrecondition;
    // Both workers have pushed in this iteration, so their counts are fixed;
    // a count no sum could hold is refused as such.
    if (header.num_samples() < 0 || header.num_samples() > kMaxSamplesPerPush) {
      codes |= kInvalidArgument;
    }
    if (header.num_samples() != kSamples[rank]) codes |= kFailedPrecondition;
  }
  std::vector<int64_t> seen;
  for (int c = 0; c < header.chunks_size(); ++c) {
    const proto::TensorChunk& chunk = header.chunks(c);
    const int64_t gc = m.layout.Global(chunk.key(), chunk.chunk());
    if (gc < 0) {
      codes |= kOutOfRange;
      continue;
    }
    if (chunk.encoding() == proto::ENCODING_TOPK) {
      // Whole pairs, no more than the chunk has, indices ascending inside
      // it, values finite.
      std::vector<float> dense(m.layout.length[gc]);
      const absl::string_view piece = data[c];
      if (!DecodeTopK(absl::MakeConstSpan(&piece, 1), absl::MakeSpan(dense)).ok()) {
        codes |= kInvalidArgument;
      }
    } else {
      const int64_t width = WireWidth(chunk.dtype());
      if (width == 0 || chunk.data_bytes() != width * m.layout.length[gc]) {
        codes |= kInvalidArgument;
      } else if (!AllFinite(data[c], chunk.dtype())) {
        codes |= kInvalidArgument;
      }
    }
    if (Registered(rank) && m.pushed[rank][gc]) codes |= kAlreadyExists;
    if (std::find(seen.begin(), seen.end(), gc) != seen.end()) codes |= kAlreadyExists;
    seen.push_back(gc);
  }
  if (codes != 0) return Refused(codes, "push with faults");
  if (header.chunks_size() == 0) return Ok("a push of no chunks");
  return NotSent("an acceptable push: it would add to the pending sums");
}

// Initialize: the server has its initial values, so every request is
// refused, whatever its credentials.
Expectation JudgeInitialize(const Model& m, const Request& r) {
  proto::InitializeRequest header;
  std::vector<absl::string_view> data;
  if (!DecodeFrame(r.bytes, &header, &data)) return Refused(kInvalidArgument, "bad framing");
  Codes codes = ChunkTypeCodes(header, /*half_allowed=*/false) |
                SessionCodes(m, r.session, header.rank());
  codes |= Registered(header.rank()) ? kFailedPrecondition : kNotFound;
  return Refused(codes, "initial values when they are complete");
}

// How long a wait with this timeout lasts (the service caps it by the
// call's deadline).
int64_t WaitMs(int64_t timeout_ms, int64_t deadline_ms) {
  return std::clamp<int64_t>(timeout_ms, 0, deadline_ms);
}

// A session on a Pull or Wait is optional but, when given, must be this
// incarnation's: ABORTED instead of an answer or a wait.
bool ForeignSession(const Model& m, const Request& r) {
  return r.session.has_value() && !r.session->empty() && !OurIncarnation(m, *r.session);
}

Expectation JudgePull(const Model& m, const Request& r, int64_t deadline_ms) {
  proto::PullRequest request;
  const bool parsed = request.ParseFromString(r.bytes);
  if (ForeignSession(m, r)) {
    return Refused(kAborted | (parsed ? 0 : kInvalidArgument), "pull with a foreign session");
  }
  if (!parsed) return Refused(kInvalidArgument, "unparsable pull");
  // The reply's encoding is checked first, alone.
  if (WireWidth(request.dtype()) == 0) return Refused(kInvalidArgument, "pull of an unknown dtype");
  // Into shared memory: no session here has any attached.
  Codes codes = request.shared_memory() ? kInvalidArgument : 0;
  int64_t total = 0;
  std::vector<int64_t> chunks;
  for (const proto::ChunkId& id : request.chunks()) {
    const int64_t gc = m.layout.Global(id.key(), id.chunk());
    if (gc < 0) {
      codes |= kOutOfRange;
      continue;
    }
    total += m.layout.length[gc];
    // Each chunk once per pull.
    if (std::find(chunks.begin(), chunks.end(), gc) != chunks.end()) codes |= kInvalidArgument;
    chunks.push_back(gc);
  }
  if (total > kChunkElements) codes |= kInvalidArgument;
  if (codes != 0) return Refused(codes, "pull of chunks that do not exist or do not fit");
  const int64_t v = request.version();
  bool ready = chunks.empty() ? kVersion >= v : true;
  for (int64_t gc : chunks) ready &= m.chunk_version[gc] >= v;
  if (!ready) {
    Expectation e = Refused(kDeadlineExceeded, "pull of a version that does not exist");
    e.wait_ms = WaitMs(request.timeout_ms(), deadline_ms);
    return e;
  }
  // Every chunk at its version (or, exact, at version v: its previous
  // values when the iteration in progress has updated it already).
  Expectation e = Ok(request.exact() ? "exact pull" : "pull");
  e.pull_dtype = request.dtype();
  e.reply_version = chunks.empty() ? kVersion : (request.exact() ? v : m.chunk_version[chunks[0]]);
  for (int64_t gc : chunks) {
    const int64_t cv = m.chunk_version[gc];
    const float* values = m.params.data() + m.layout.offset[gc];
    if (request.exact() && cv != v) {
      auto previous = m.params_at.find(cv - 1);
      if (cv != v + 1 || previous == m.params_at.end()) {
        return Refused(kFailedPrecondition, "exact pull of a version gone");
      }
      values = previous->second.data() + m.layout.offset[gc];
    }
    if (!request.exact()) e.reply_version = std::min(e.reply_version, cv);
    e.pull_chunks.push_back({gc, values});
  }
  return e;
}

Expectation JudgeWait(const Model& m, const Request& r, int64_t deadline_ms) {
  proto::WaitRequest request;
  if (!request.ParseFromString(r.bytes)) {
    Expectation e =
        Refused(kInvalidArgument | (ForeignSession(m, r) ? kAborted : 0), "unparsable wait");
    e.unparsable_protobuf = true;
    return e;
  }
  if (ForeignSession(m, r)) return Refused(kAborted, "wait with a foreign session");
  if (request.version() > kVersion) {
    Expectation e = Refused(kDeadlineExceeded, "wait for a version that does not exist");
    e.wait_ms = WaitMs(request.timeout_ms(), deadline_ms);
    return e;
  }
  Expectation e = Ok("wait");
  e.reply_version = kVersion;
  return e;
}

// Heartbeat: the rank's session, checked as a push's; a valid one is OK
// with the server's version (it refreshes the rank's liveness, which is
// its purpose and none of the state the flood protects).
Expectation JudgeHeartbeat(const Model& m, const Request& r) {
  proto::HeartbeatRequest request;
  if (!request.ParseFromString(r.bytes)) {
    Expectation e = Refused(kInvalidArgument, "unparsable heartbeat");
    e.unparsable_protobuf = true;
    return e;
  }
  if (const Codes codes = SessionCodes(m, r.session, request.rank()); codes != 0) {
    return Refused(codes, "heartbeat without its rank's session");
  }
  Expectation e = Ok("heartbeat");
  e.reply_version = kVersion;
  return e;
}

// Restore: the rank's session first, then the version: below 0
// INVALID_ARGUMENT, past the server's OUT_OF_RANGE, the server's own OK
// (nothing to do), an older one FAILED_PRECONDITION (the service under test
// keeps no checkpoints, so a restore that would restart it is never
// accepted).
Expectation JudgeRestore(const Model& m, const Request& r) {
  proto::RestoreRequest request;
  if (!request.ParseFromString(r.bytes)) {
    Expectation e = Refused(kInvalidArgument, "unparsable restore");
    e.unparsable_protobuf = true;
    return e;
  }
  if (const Codes codes = SessionCodes(m, r.session, request.rank()); codes != 0) {
    return Refused(codes, "restore without its rank's session");
  }
  if (request.version() < 0) return Refused(kInvalidArgument, "restore to a negative version");
  if (request.version() > kVersion) return Refused(kOutOfRange, "restore to a future version");
  if (request.version() < kVersion) {
    return Refused(kFailedPrecondition, "restore on a server without checkpoints");
  }
  return Ok("restore to the current version");
}

// Register: every slot is taken, so only a re-registration of w0 or w1 with
// the job's signature and steps is accepted; it is not sent (a worker that
// registers again mid-iteration rejoins it: a new session, its pushes
// carried, which is a change of state), nor is one that differs only in a
// wrong identity proof (refused while the worker is live, accepted after).
// Sessions are not looked at.
Expectation JudgeRegister(const Model& m, const Request& r) {
  proto::RegisterRequest request;
  if (!request.ParseFromString(r.bytes)) {
    Expectation e = Refused(kInvalidArgument, "unparsable register");
    e.unparsable_protobuf = true;
    return e;
  }
  Codes codes = 0;
  size_t echoed = request.worker_id().size();
  for (const proto::TensorSpec& t : request.signature())
    echoed += t.name().size() + 4 * t.shape_size();
  const bool huge = echoed > 2048;
  if (request.worker_id().empty()) codes |= kInvalidArgument;
  if (request.job_run().size() > kMaxJobRunBytes) codes |= kInvalidArgument;
  // Bounds on what a refusal could quote.
  if (request.worker_id().size() > kMaxWorkerIdBytes ||
      request.identity_proof().size() > kMaxIdentityProofBytes) {
    codes |= kInvalidArgument;
  }
  for (const proto::TensorSpec& t : request.signature()) {
    if (t.name().size() > kMaxTensorNameBytes ||
        t.shape_size() > kMaxDimensions) {
      codes |= kInvalidArgument;
    }
  }
  const std::vector<ParamSpec>& signature = m.layout.signature;
  bool same = request.signature_size() == static_cast<int>(signature.size());
  for (int i = 0; i < request.signature_size(); ++i) {
    const proto::TensorSpec& t = request.signature(i);
    if (t.dtype() != proto::DTYPE_F32) codes |= kInvalidArgument;
    for (int64_t d : t.shape()) {
      if (d < 0) codes |= kInvalidArgument;
    }
    if (i < static_cast<int>(signature.size())) {
      same &= t.name() == signature[i].name &&
              std::equal(t.shape().begin(), t.shape().end(), signature[i].shape.begin(),
                         signature[i].shape.end());
    }
  }
  if (!same) codes |= kFailedPrecondition;
  const bool has_rank = request.has_requested_rank();
  const int requested = request.requested_rank();
  if (has_rank && !Registered(requested)) codes |= kInvalidArgument;
  if (request.steps_per_epoch() < 0) codes |= kInvalidArgument;
  if (request.steps_per_epoch() != kStepsPerEpoch) codes |= kFailedPrecondition;
  int rank = -1;
  for (int r = 0; r < kNumWorkers; ++r) {
    if (request.worker_id() == kWorkerIds[r]) rank = r;
  }
  if (rank >= 0) {
    if (has_rank && Registered(requested) && requested != rank) codes |= kAlreadyExists;
    // A faulty one may reach the identity check first: w0 and w1 are live
    // (registered in process, heard within the liveness timeout while the
    // campaign runs) and no mutation knows their proof.
    if (codes != 0) codes |= kAlreadyExists;
  } else if (!request.worker_id().empty()) {
    codes |= has_rank && Registered(requested) ? kAlreadyExists : kResourceExhausted;
  }
  if (codes == 0) return NotSent("a valid re-registration: a rejoin");
  Expectation e = Refused(codes, "register with faults, or with every slot taken");
  e.echoes_huge_strings = huge;
  return e;
}

// ---------------------------------------------------------------------------
// Reply checks for calls that must succeed ("" when the reply is right).

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::string out;
  std::vector<grpc::Slice> slices;
  if (!buffer.Valid() || !buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::string CheckEmptyReply(const Model&, const Expectation&, const std::string& reply) {
  return reply.empty() ? "" : absl::StrCat("reply of ", reply.size(), " bytes, not empty");
}

// A push's reply is a PushReply (empty, or naming the next iteration's
// members), small whatever the push.
std::string CheckPushReply(const Model&, const Expectation&, const std::string& reply) {
  proto::PushReply parsed;
  if (!parsed.ParseFromString(reply)) return "unparsable push reply";
  if (reply.size() > 1024) return absl::StrCat("a push reply of ", reply.size(), " bytes");
  return "";
}

std::string CheckPullReply(const Model& m, const Expectation& e, const std::string& reply) {
  if (reply.size() > kMaxMessageBytes) {
    return absl::StrCat("a pull reply of ", reply.size(),
                        " bytes, over gRPC's 4 MiB receive limit");
  }
  proto::PullReply header;
  std::vector<absl::string_view> data;
  if (!DecodeFrame(reply, &header, &data)) return "the pull reply is not a well-formed frame";
  if (header.version() != e.reply_version) {
    return absl::StrCat("pull reply at version ", header.version(), ", expected ", e.reply_version);
  }
  if (header.chunks_size() != static_cast<int>(e.pull_chunks.size())) {
    return absl::StrCat("pull reply of ", header.chunks_size(), " chunks, expected ",
                        e.pull_chunks.size());
  }
  for (int c = 0; c < header.chunks_size(); ++c) {
    const proto::TensorChunk& chunk = header.chunks(c);
    const auto& [gc, values] = e.pull_chunks[c];
    // The snapshot's fp32 values in the encoding the pull asked for.
    const int64_t length = m.layout.length[gc];
    std::string want(WireWidth(e.pull_dtype) * length, '\0');
    if (e.pull_dtype == proto::DTYPE_F32) {
      std::memcpy(want.data(), values, want.size());
    } else {
      for (int64_t i = 0; i < length; ++i) {
        const uint16_t bits = e.pull_dtype == proto::DTYPE_F16 ? FloatToHalf(values[i])
                                                               : FloatToBfloat16(values[i]);
        std::memcpy(want.data() + 2 * i, &bits, 2);
      }
    }
    if (chunk.key() != m.layout.key[gc] || chunk.chunk() != m.layout.chunk[gc] ||
        chunk.dtype() != e.pull_dtype || chunk.data_bytes() != static_cast<int64_t>(want.size()) ||
        data[c] != want) {
      return absl::StrCat("pull reply chunk ", c, " is not global chunk ", gc, " as snapshotted");
    }
  }
  return "";
}

std::string CheckHeartbeatReply(const Model&, const Expectation& e, const std::string& reply) {
  proto::HeartbeatReply parsed;
  if (!parsed.ParseFromString(reply)) return "unparsable heartbeat reply";
  if (parsed.version() != e.reply_version) {
    return absl::StrCat("heartbeat reply version ", parsed.version(), ", expected ",
                        e.reply_version);
  }
  return "";
}

std::string CheckWaitReply(const Model&, const Expectation& e, const std::string& reply) {
  proto::WaitReply parsed;
  if (!parsed.ParseFromString(reply)) return "unparsable wait reply";
  if (parsed.version() != e.reply_version) {
    return absl::StrCat("wait reply version ", parsed.version(), ", expected ", e.reply_version);
  }
  return "";
}

// ---------------------------------------------------------------------------
// Mutators. Each works at one of two levels:
//   - structured: on the message before it is serialized (a field set to an
//     interesting value, chunks duplicated, dropped, resized or poisoned),
//     to reach the checks behind a well-formed frame and a parsable header;
//   - bytes: on the serialized request (bit flips, insertions, deletions,
//     truncation, a rewritten length prefix, random bytes), to reach the
//     framing and parsing code.

using Rng = std::mt19937_64;

uint64_t Below(Rng& rng, uint64_t n) { return rng() % n; }
bool OneIn(Rng& rng, uint64_t n) { return Below(rng, n) == 0; }

// Values at and around the edges: the server compares, indexes and sums
// with these, so off-by-ones, sign errors and overflow live there.
int64_t Interesting64(Rng& rng, int64_t near) {
  static constexpr int64_t kEdges[] = {0,
                                       -1,
                                       1,
                                       std::numeric_limits<int64_t>::min(),
                                       std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min() + 1,
                                       std::numeric_limits<int64_t>::max() - 1,
                                       std::numeric_limits<int32_t>::max(),
                                       std::numeric_limits<int32_t>::min(),
                                       int64_t{1} << 32,
                                       -(int64_t{1} << 32),
                                       int64_t{1} << 62};
  switch (Below(rng, 4)) {
    case 0:
      return near + static_cast<int64_t>(Below(rng, 5)) - 2;
    case 1:
      return kEdges[Below(rng, std::size(kEdges))];
    case 2:
      return static_cast<int64_t>(rng());
    default:
      return static_cast<int64_t>(Below(rng, 12)) - 4;
  }
}
int32_t Interesting32(Rng& rng, int32_t near) {
  static constexpr int32_t kEdges[] = {0,
                                       -1,
                                       1,
                                       std::numeric_limits<int32_t>::min(),
                                       std::numeric_limits<int32_t>::max(),
                                       std::numeric_limits<int32_t>::max() - 1,
                                       1 << 16};
  switch (Below(rng, 4)) {
    case 0:
      return near + static_cast<int32_t>(Below(rng, 5)) - 2;
    case 1:
      return kEdges[Below(rng, std::size(kEdges))];
    case 2:
      return static_cast<int32_t>(rng());
    default:
      return static_cast<int32_t>(Below(rng, 8)) - 2;
  }
}

// Floats the server must refuse (NaN, Inf) and finite ones near the edges
// that it must accept (a poisoned push is refused only for the former).
float SpecialFloat(Rng& rng) {
  static constexpr uint32_t kBits[] = {
      0x7fc00000,  // quiet NaN
      0xffc00000,  // negative quiet NaN
      0x7f800001,  // signalling NaN
      0x7fffffff,  // NaN, every payload bit
      0x7f800000,  // +Inf
      0xff800000,  // -Inf
      0x80000000,  // -0
      0x00000001,  // smallest denormal
      0x7f7fffff,  // FLT_MAX
      0xff7fffff,  // -FLT_MAX
  };
  const uint32_t bits = kBits[Below(rng, std::size(kBits))];
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::string FloatBytes(int64_t n, Rng& rng) {
  std::string bytes(static_cast<size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float f = static_cast<float>(Below(rng, 2001)) / 1000.f - 1.f;
    std::memcpy(&bytes[i * 4], &f, 4);
  }
  return bytes;
}

std::string RandomBytes(size_t n, Rng& rng) {
  std::string bytes(n, '\0');
  for (char& b : bytes) b = static_cast<char>(rng());
  return bytes;
}

// The size of a huge repeated field: log-uniform from 64 KiB to `max`, so
// that most are affordable and some reach the limit.
size_t HugeBytes(Rng& rng, size_t max) {
  const double lo = std::log(double{64 << 10});
  const double x =
      lo + (std::log(static_cast<double>(max)) - lo) * (Below(rng, 1 << 20) / double{1 << 20});
  return static_cast<size_t>(std::exp(x));
}

// Huge pulls are capped lower: a pull of many ids of the empty chunk costs
// the server ~300 bytes of heap and 0.5 us per id (measured: a 4 MB
// request of 1M ids, ~300 MB and 0.5-0.7 s; see
// APullOfMillionsOfEmptyChunksIsRefused), which would turn the
// flood into that one case.
constexpr size_t kMaxHugePullBytes = 64 << 10;

// So are a Register's strings and shapes, which the server prints whole
// into its refusal: a 4 MiB shape is 4M dimensions, copied into a ParamSpec
// and printed into a 12 MB message (measured: 1.2 s and +80 MB of heap for
// the one request; see ARefusalNeverEchoesAnUnboundedString).
// 64 KiB is still far past the 8 KiB of metadata a status must fit in.
constexpr size_t kMaxHugeEchoBytes = 64 << 10;

// A Push or Initialize request before framing: its header's fields, and each
// chunk's header entry with the bytes that follow the header for it.
struct FrameMessage {
  int32_t rank = 0;
  int64_t iteration = 0;
  int64_t num_samples = 0;
  struct Chunk {
    proto::TensorChunk header;
    std::string data;
  };
  std::vector<Chunk> chunks;
};

FrameMessage::Chunk ChunkOf(const Layout& layout, int64_t gc, Rng& rng) {
  FrameMessage::Chunk chunk;
  chunk.header.set_key(layout.key[gc]);
  chunk.header.set_chunk(layout.chunk[gc]);
  chunk.header.set_dtype(proto::DTYPE_F32);
  chunk.data = FloatBytes(layout.length[gc], rng);
  chunk.header.set_data_bytes(static_cast<int64_t>(chunk.data.size()));
  return chunk;
}

FrameMessage MakeFrameMessage(const Layout& layout, int rank, int64_t iteration,
                              int64_t num_samples, const std::vector<int64_t>& globals, Rng& rng) {
  FrameMessage m;
  m.rank = rank;
  m.iteration = iteration;
  m.num_samples = num_samples;
  for (int64_t gc : globals) m.chunks.push_back(ChunkOf(layout, gc, rng));
  return m;
}

// The frame's bytes, built with proto/wire_format.h as the worker builds them.
std::string Serialize(const FrameMessage& m, bool initialize) {
  std::vector<grpc::Slice> data;
  for (const FrameMessage::Chunk& c : m.chunks) data.emplace_back(c.data);
  if (initialize) {
    proto::InitializeRequest header;
    header.set_rank(m.rank);
    for (const FrameMessage::Chunk& c : m.chunks) *header.add_chunks() = c.header;
    return Flatten(proto::MakeFrame(header, data));
  }
  proto::PushRequest header;
  header.set_rank(m.rank);
  header.set_iteration(m.iteration);
  header.set_num_samples(m.num_samples);
  for (const FrameMessage::Chunk& c : m.chunks) *header.add_chunks() = c.header;
  return Flatten(proto::MakeFrame(header, data));
}

// One structured mutation of a Push or Initialize request.
void MutateFrameMessage(const Layout& layout, FrameMessage* m, Rng& rng) {
  FrameMessage::Chunk* chunk =
      m->chunks.empty() ? nullptr : &m->chunks[Below(rng, m->chunks.size())];
  auto set_data = [](FrameMessage::Chunk* c, std::string data) {
    c->data = std::move(data);
    c->header.set_data_bytes(static_cast<int64_t>(c->data.size()));
  };
  switch (Below(rng, 18)) {
    case 0:  // a rank: unregistered, negative, the other worker's
      m->rank = Interesting32(rng, static_cast<int32_t>(Below(rng, kNumWorkers)));
      return;
    case 1:  // an iteration: past, future, extreme
      m->iteration = Interesting64(rng, kVersion);
      return;
    case 2:  // a sample count differing from the worker's earlier pushes
      m->num_samples = Interesting64(rng, kSamples[Below(rng, kNumWorkers)]);
      return;
    case 3:  // a key out of range (or another key's)
      if (chunk) chunk->header.set_key(Interesting32(rng, 1));
      return;
    case 4:  // a chunk index out of range (or another chunk's)
      if (chunk) chunk->header.set_chunk(Interesting64(rng, 1));
      return;
    case 5: {  // a dtype we do not store, or not a dtype at all
      static constexpr int kDtypes[] = {
          proto::DTYPE_F16, proto::DTYPE_BF16, 3, 99, -1, std::numeric_limits<int32_t>::max()};
      if (chunk) chunk->header.set_dtype(static_cast<proto::DType>(kDtypes[Below(rng, 6)]));
      return;
    }
    case 6: {  // data_bytes disagreeing with the bytes behind the header
      if (!chunk) return;
      const int64_t n = chunk->header.data_bytes();
      const int64_t choices[] = {0,
                                 n - 1,
                                 n + 1,
                                 n - 4,
                                 n + 4,
                                 -1,
                                 -4,
                                 2 * n,
                                 std::numeric_limits<int64_t>::min(),
                                 std::numeric_limits<int64_t>::max(),
                                 Interesting64(rng, n)};
      chunk->header.set_data_bytes(choices[Below(rng, std::size(choices))]);
      return;
    }
    case 7: {  // a few elements (or bytes) more or fewer, consistently framed
      if (!chunk) return;
      std::string data = chunk->data;
      const size_t unit = OneIn(rng, 2) ? 4 : 1;
      const size_t k = unit * (1 + Below(rng, 3));
      if (OneIn(rng, 2)) {
        data.append(RandomBytes(k, rng));
      } else {
        data.resize(data.size() > k ? data.size() - k : 0);
      }
      set_data(chunk, std::move(data));
      return;
    }
    case 8: {  // a NaN, an Inf or an edge of the finite range in the payload
      if (!chunk || chunk->data.size() < 4) return;
      const float f = SpecialFloat(rng);
      std::memcpy(&chunk->data[4 * Below(rng, chunk->data.size() / 4)], &f, 4);
      return;
    }
    case 9:  // a chunk twice in one message
      if (chunk) m->chunks.insert(m->chunks.begin() + Below(rng, m->chunks.size() + 1), *chunk);
      return;
    case 10:
      if (chunk) m->chunks.erase(m->chunks.begin() + (chunk - m->chunks.data()));
      return;
    case 11:
      if (m->chunks.size() >= 2) std::swap(m->chunks.front(), m->chunks.back());
      return;
    case 12: {  // an oversized chunk: more elements than a chunk holds
      if (!chunk) return;
      const int64_t sizes[] = {kChunkElements + 1, 2 * kChunkElements, 1000, int64_t{1} << 16};
      set_data(chunk, FloatBytes(sizes[Below(rng, std::size(sizes))], rng));
      return;
    }
    case 13:  // data inside the header, as an old client would send it
      if (chunk) {
        chunk->header.set_data(RandomBytes(1 + Below(rng, 16), rng));
        if (OneIn(rng, 2)) set_data(chunk, "");
      }
      return;
    case 14: {  // one more chunk, valid or not
      const int64_t gc = static_cast<int64_t>(Below(rng, layout.total_chunks()));
      m->chunks.push_back(ChunkOf(layout, gc, rng));
      if (OneIn(rng, 3)) m->chunks.back().header.set_key(Interesting32(rng, 1));
      return;
    }
    case 15:
      m->chunks.clear();
      return;
    case 16:  // repair: the right length for whatever (key, chunk) it names,
              // so that the checks behind the length check are reached
      for (FrameMessage::Chunk& c : m->chunks) {
        const int64_t gc = layout.Global(c.header.key(), c.header.chunk());
        if (gc >= 0) set_data(&c, FloatBytes(layout.length[gc], rng));
      }
      return;
    default: {  // rarely: a huge repeated field, up to the 4 MiB limit
      if (!chunk || !OneIn(rng, 16)) {
        m->rank = static_cast<int32_t>(Below(rng, kNumWorkers));
        return;
      }
      const size_t target = HugeBytes(rng, kMaxMessageBytes);
      const size_t each = 16 + chunk->data.size();
      const FrameMessage::Chunk copy = *chunk;
      for (size_t bytes = 0; bytes + each < target; bytes += each) m->chunks.push_back(copy);
      return;
    }
  }
}

// One byte-level mutation of a serialized request.
void MutateBytes(std::string* bytes, bool framed, Rng& rng) {
  std::string& b = *bytes;
  auto pos = [&](size_t extra) { return static_cast<size_t>(Below(rng, b.size() + extra)); };
  switch (Below(rng, framed ? 11 : 10)) {
    case 0:
    case 1:  // bit flips
      if (!b.empty()) {
        for (uint64_t i = 0, n = 1 + Below(rng, 4); i < n; ++i) {
          b[pos(0)] ^= static_cast<char>(1 << Below(rng, 8));
        }
      }
      return;
    case 2: {  // a byte set to an edge value
      static constexpr char kBytes[] = {0, 1, 0x7f, static_cast<char>(0x80),
                                        static_cast<char>(0xff)};
      if (!b.empty()) b[pos(0)] = kBytes[Below(rng, std::size(kBytes))];
      return;
    }
    case 3:  // random bytes inserted
      b.insert(pos(1), RandomBytes(1 + Below(rng, 16), rng));
      return;
    case 4:  // a range deleted
      if (!b.empty()) {
        const size_t at = pos(0);
        b.erase(at, 1 + Below(rng, 16));
      }
      return;
    case 5:  // truncated
      if (!b.empty()) b.resize(pos(0));
      return;
    case 6:  // a range copied elsewhere
      if (!b.empty()) {
        const size_t at = pos(0);
        const std::string range = b.substr(at, 1 + Below(rng, 32));
        b.insert(pos(1), range);
      }
      return;
    case 7:  // a run of 0xff: varints that do not end, or end far too late
      if (!b.empty()) {
        const size_t at = pos(0);
        for (size_t i = at; i < std::min(b.size(), at + 1 + Below(rng, 10)); ++i) {
          b[i] = static_cast<char>(0xff);
        }
      }
      return;
    case 8:  // random bytes, of random length (rarely long)
      b = RandomBytes(OneIn(rng, 64) ? Below(rng, 1 << 16) : Below(rng, 64), rng);
      return;
    case 9:  // empty
      b.clear();
      return;
    default: {  // the frame's header length: zero, huge, off by one, the rest
      if (b.size() < 4) b.resize(4, '\0');
      const uint32_t length = LittleEndian32(b);
      const uint32_t rest = static_cast<uint32_t>(b.size() - 4);
      const uint32_t choices[] = {
          0,        1,           length - 1,  length + 1,  rest,
          rest + 1, 0xffffffffu, 0x80000000u, 0x7fffffffu, static_cast<uint32_t>(rng())};
      const uint32_t v = choices[Below(rng, std::size(choices))];
      for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
      return;
    }
  }
}

proto::PullRequest MakePull(int64_t version, int64_t timeout_ms,
                            const std::vector<std::pair<int, int64_t>>& ids, bool exact = false) {
  proto::PullRequest r;
  r.set_version(version);
  r.set_timeout_ms(timeout_ms);
  r.set_exact(exact);
  for (const auto& [key, chunk] : ids) {
    proto::ChunkId* id = r.add_chunks();
    id->set_key(key);
    id->set_chunk(chunk);
  }
  return r;
}

// Timeouts: mostly none or a millisecond, so that waits cannot stall the
// flood; rarely a long or extreme one (the call's deadline bounds it).
int64_t AnyTimeout(Rng& rng) {
  static constexpr int64_t kShort[] = {0, 1, 2, -1, -1000, std::numeric_limits<int64_t>::min()};
  static constexpr int64_t kLong[] = {std::numeric_limits<int64_t>::max(), 3600 * 1000,
                                      3600 * 1000 + 1, 100};
  return OneIn(rng, 16) ? kLong[Below(rng, std::size(kLong))]
                        : kShort[Below(rng, std::size(kShort))];
}

void MutatePull(const Layout& layout, proto::PullRequest* r, Rng& rng) {
  proto::ChunkId* id =
      r->chunks_size() == 0 ? nullptr : r->mutable_chunks(Below(rng, r->chunks_size()));
  switch (Below(rng, 9)) {
    case 0:  // a version: past, the next (some chunks have it), far, extreme
      r->set_version(Interesting64(rng, kVersion));
      return;
    case 1:
      r->set_timeout_ms(AnyTimeout(rng));
      return;
    case 2:
      if (id) id->set_key(Interesting32(rng, 1));
      return;
    case 3:
      if (id) id->set_chunk(Interesting64(rng, 1));
      return;
    case 4: {  // one more chunk
      const int64_t gc = static_cast<int64_t>(Below(rng, layout.total_chunks()));
      proto::ChunkId* more = r->add_chunks();
      more->set_key(layout.key[gc]);
      more->set_chunk(layout.chunk[gc]);
      return;
    }
    case 5:  // a chunk twice
      if (id) *r->add_chunks() = *id;
      return;
    case 6:
      if (id)
        r->mutable_chunks()->DeleteSubrange(static_cast<int>(Below(rng, r->chunks_size())), 1);
      return;
    case 7:
      r->clear_chunks();
      return;
    default: {  // exact or not; rarely a huge repeated field, up to 4 MiB
      if (!id || !OneIn(rng, 16)) {
        r->set_exact(!r->exact());
        return;
      }
      const proto::ChunkId copy = *id;
      const size_t target = HugeBytes(rng, kMaxHugePullBytes);
      const size_t each = 2 + copy.ByteSizeLong();
      for (size_t bytes = 0; bytes + each < target; bytes += each) *r->add_chunks() = copy;
      return;
    }
  }
}

void MutateWait(proto::WaitRequest* r, Rng& rng) {
  if (OneIn(rng, 2)) {
    r->set_version(Interesting64(rng, kVersion));
  } else {
    r->set_timeout_ms(AnyTimeout(rng));
  }
}

proto::RegisterRequest MakeRegister(const std::string& id, int requested_rank) {
  proto::RegisterRequest r;
  r.set_worker_id(id);
  for (const ParamSpec& spec : Signature()) {
    proto::TensorSpec* t = r.add_signature();
    t->set_name(spec.name);
    for (int64_t d : spec.shape) t->add_shape(d);
  }
  if (requested_rank >= 0) r.set_requested_rank(requested_rank);
  r.set_steps_per_epoch(kStepsPerEpoch);
  return r;
}

void MutateRegister(proto::RegisterRequest* r, Rng& rng) {
  proto::TensorSpec* t =
      r->signature_size() == 0 ? nullptr : r->mutable_signature(Below(rng, r->signature_size()));
  switch (Below(rng, 10)) {
    case 0: {  // an id: empty, taken, new, invalid UTF-8, rarely huge
      static const char* const kIds[] = {"", "w0", "w1", "intruder", "w0 ", "\xff\xfe", "W0"};
      if (OneIn(rng, 64)) {
        r->set_worker_id(std::string(HugeBytes(rng, kMaxHugeEchoBytes), 'x'));
      } else {
        r->set_worker_id(std::string(kIds[Below(rng, std::size(kIds))]));
        if (OneIn(rng, 8)) r->mutable_worker_id()->push_back('\0');
      }
      if (OneIn(rng, 4)) {  // an identity proof: a guess, or one over the bound
        r->set_identity_proof(OneIn(rng, 4) ? std::string(kMaxIdentityProofBytes + 1, 'p')
                                            : std::string("a guess"));
      }
      return;
    }
    case 1:  // a rank: another worker's, out of range, negative, or none
      if (OneIn(rng, 3)) {
        r->clear_requested_rank();
      } else {
        r->set_requested_rank(Interesting32(rng, static_cast<int32_t>(Below(rng, kNumWorkers))));
      }
      return;
    case 2:
      r->set_steps_per_epoch(Interesting64(rng, kStepsPerEpoch));
      return;
    case 3: {  // a tensor's name
      static const char* const kNames[] = {"", "w ", "b", "x", "\xc3\x28", "e"};
      if (t) t->set_name(kNames[Below(rng, std::size(kNames))]);
      return;
    }
    case 4:  // a dimension: negative, zero, huge, off by one
      if (t && t->shape_size() > 0) {
        t->set_shape(Below(rng, t->shape_size()), Interesting64(rng, t->shape(0)));
      }
      return;
    case 5:  // a dimension more or fewer
      if (t) {
        if (OneIn(rng, 2) || t->shape_size() == 0) {
          t->add_shape(OneIn(rng, 2) ? 1 : Interesting64(rng, 1));
        } else {
          t->mutable_shape()->RemoveLast();
        }
      }
      return;
    case 6: {  // a dtype we do not store
      static constexpr int kDtypes[] = {proto::DTYPE_F16, proto::DTYPE_BF16, 3, -1};
      if (t) t->set_dtype(static_cast<proto::DType>(kDtypes[Below(rng, 4)]));
      return;
    }
    case 7:  // a tensor more, fewer or swapped
      if (!t) return;
      switch (Below(rng, 3)) {
        case 0:
          *r->add_signature() = *t;
          return;
        case 1:
          r->mutable_signature()->RemoveLast();
          return;
        default:
          if (r->signature_size() >= 2)
            r->mutable_signature()->SwapElements(0, r->signature_size() - 1);
          return;
      }
    case 8:
      r->clear_signature();
      return;
    default: {  // rarely: a huge repeated field (dimensions or tensors)
      if (!t || !OneIn(rng, 16)) {
        r->set_worker_id(kWorkerIds[Below(rng, kNumWorkers)]);
        return;
      }
      if (OneIn(rng, 2)) {
        const size_t target = HugeBytes(rng, kMaxHugeEchoBytes);
        for (size_t i = 0; i < target; ++i) t->add_shape(1);
      } else {
        const size_t target = HugeBytes(rng, kMaxMessageBytes);
        const proto::TensorSpec copy = *t;
        const size_t each = 2 + copy.ByteSizeLong();
        for (size_t bytes = 0; bytes + each < target; bytes += each) *r->add_signature() = copy;
      }
      return;
    }
  }
}

// ---------------------------------------------------------------------------
// The methods, one row each: how to make an input (a seed, mutated), judge
// it and check a successful reply. A new RPC is one more row.

struct Method {
  const char* path;
  const char* name;
  int weight;
  bool framed;          // a frame: its length prefix is mutated too
  int64_t deadline_ms;  // the call's deadline
  std::function<Request(const Model&, Rng&)> generate;
  std::function<Expectation(const Model&, const Request&, int64_t deadline_ms)> judge;
  std::function<std::string(const Model&, const Expectation&, const std::string&)> check_ok;
};

// None for 30% of the inputs (the seed as it is, or only its bytes
// mutated), else one to three.
int StructuredMutations(Rng& rng) {
  return Below(rng, 10) < 3 ? 0 : 1 + static_cast<int>(Below(rng, 3));
}

// Credentials as a worker sends them (the job token; on pushes and initial
// values the session of the seed's rank, on pulls and waits now and then
// either worker's), and for a fraction of the inputs one of the ways they
// go wrong: the token missing, empty, nearly right or wrong; the session
// missing, empty, the other worker's, another server process's (the
// reference server's), this process's incarnation with a made-up secret or
// none, or one character off. All printable ASCII, as metadata must be.
void AddCredentials(const Model& m, int rank, bool needs_session, Request* r, Rng& rng) {
  r->job_token = kJobToken;
  if (OneIn(rng, 12)) {
    switch (Below(rng, 6)) {
      case 0:  // missing
        r->job_token.reset();
        break;
      case 1:  // empty
        r->job_token = "";
        break;
      case 2:  // its last character wrong
        r->job_token->back() = 'X';
        break;
      case 3:  // one character short
        r->job_token->pop_back();
        break;
      case 4:  // one character more
        r->job_token->push_back('f');
        break;
      default:  // a session instead
        r->job_token = m.sessions[0];
        break;
    }
  }
  if (needs_session) {
    r->session = m.sessions[rank];
  } else if (OneIn(rng, 4)) {
    r->session = m.sessions[Below(rng, kNumWorkers)];
  }
  if (OneIn(rng, 5)) {
    const std::string& own = m.sessions[Below(rng, kNumWorkers)];
    switch (Below(rng, 9)) {
      case 0:  // missing
        r->session.reset();
        break;
      case 1:  // empty
        r->session = "";
        break;
      case 2:  // the other worker's
        r->session = m.sessions[(rank + 1) % kNumWorkers];
        break;
      case 3:  // another server process's
        r->session = m.foreign_session;
        break;
      case 4:  // this process's, with a made-up secret
        r->session = absl::StrCat(m.incarnation, "-", std::string(32, '0'));
        break;
      case 5:  // the incarnation alone
        r->session = m.incarnation;
        break;
      case 6:  // the incarnation and an empty secret
        r->session = absl::StrCat(m.incarnation, "-");
        break;
      case 7:  // a worker's, one character off
        r->session = own;
        r->session->back() = r->session->back() == '0' ? '1' : '0';
        break;
      default:  // a worker's, one character more
        r->session = absl::StrCat(own, "0");
        break;
    }
  }
}

std::vector<Method> Methods() {
  std::vector<Method> methods;
  // Push seeds, at the flood's state (rank 0 has pushed w:0, w:1, b:0 with
  // 8 samples; rank 1 w:1, w:2, e:0 with 6): the two pushes that would
  // complete the iteration (acceptable as they are: their mutations sit on
  // the edge of acceptance), repeats, other iterations, every chunk, none.
  methods.push_back(
      {proto::kPushMethod, "Push", 35, true, 10000,
       [](const Model& m, Rng& rng) {
         const int64_t v = kVersion;
         const std::vector<std::pair<int, std::pair<int64_t, std::vector<int64_t>>>> seeds = {
             {0, {v, {2, 4}}},
             {1, {v, {0, 3}}},
             {0, {v, {0}}},
             {1, {v, {1}}},
             {0, {v + 1, {2}}},
             {1, {v - 1, {3}}},
             {0, {v, {0, 1, 2, 3, 4}}},
             {1, {v, {}}}};
         const auto& [rank, rest] = seeds[Below(rng, seeds.size())];
         FrameMessage msg =
             MakeFrameMessage(m.layout, rank, rest.first, kSamples[rank], rest.second, rng);
         for (int i = StructuredMutations(rng); i > 0; --i) MutateFrameMessage(m.layout, &msg, rng);
         Request r;
         r.bytes = Serialize(msg, /*initialize=*/false);
         AddCredentials(m, rank, /*needs_session=*/true, &r, rng);
         return r;
       },
       [](const Model& m, const Request& r, int64_t) { return JudgePush(m, r); }, CheckPushReply});
  // Initialize seeds: the whole model from rank 0 (as a first worker sends
  // it), part of it from rank 1, nothing.
  methods.push_back(
      {proto::kInitializeMethod, "Initialize", 10, true, 10000,
       [](const Model& m, Rng& rng) {
         const std::vector<std::pair<int, std::vector<int64_t>>> seeds = {
             {0, {0, 1, 2, 3, 4}}, {1, {0, 3}}, {0, {}}};
         const auto& [rank, globals] = seeds[Below(rng, seeds.size())];
         FrameMessage msg = MakeFrameMessage(m.layout, rank, 0, 0, globals, rng);
         for (int i = StructuredMutations(rng); i > 0; --i) MutateFrameMessage(m.layout, &msg, rng);
         Request r;
         r.bytes = Serialize(msg, /*initialize=*/true);
         AddCredentials(m, rank, /*needs_session=*/true, &r, rng);
         return r;
       },
       [](const Model& m, const Request& r, int64_t) { return JudgeInitialize(m, r); },
       CheckEmptyReply});
  // Pull seeds: chunks at the server's version, one a version ahead (w:1,
  // applied in iteration 2), a version not there yet, the whole message's
  // worth, the empty tensor, nothing (the server's version); exact pulls of
  // a chunk's previous version, of its current one and of one gone.
  methods.push_back({proto::kPullMethod, "Pull", 25, false, 500,
                     [](const Model& m, Rng& rng) {
                       const int64_t v = kVersion;
                       const std::vector<proto::PullRequest> seeds = {
                           MakePull(v, 0, {{0, 0}}),           MakePull(v + 1, 1, {{0, 1}}),
                           MakePull(v + 1, 0, {{0, 0}}),       MakePull(v, 1, {{0, 2}, {2, 0}}),
                           MakePull(v, 0, {{1, 0}, {2, 0}}),   MakePull(v, 0, {}),
                           MakePull(v - 1, 1, {{2, 0}}),       MakePull(0, 0, {{0, 0}}),
                           MakePull(v, 0, {{0, 1}}, true),     MakePull(v - 1, 0, {{0, 0}}, true),
                           MakePull(v + 1, 0, {{0, 1}}, true), MakePull(0, 0, {{1, 0}}, true)};
                       Request r;
                       proto::PullRequest pull = seeds[Below(rng, seeds.size())];
                       for (int i = StructuredMutations(rng); i > 0; --i)
                         MutatePull(m.layout, &pull, rng);
                       r.bytes = pull.SerializeAsString();
                       AddCredentials(m, 0, /*needs_session=*/false, &r, rng);
                       return r;
                     },
                     JudgePull, CheckPullReply});
  methods.push_back(
      {kWaitMethod, "Wait", 10, false, 500,
       [](const Model& m, Rng& rng) {
         proto::WaitRequest wait;
         static constexpr int64_t kSeeds[][2] = {
             {kVersion, 0}, {kVersion - 1, 1}, {kVersion + 1, 1}, {0, 0}, {kVersion + 1, 0}};
         const auto& seed = kSeeds[Below(rng, std::size(kSeeds))];
         wait.set_version(seed[0]);
         wait.set_timeout_ms(seed[1]);
         for (int i = StructuredMutations(rng); i > 0; --i) MutateWait(&wait, rng);
         Request r;
         r.bytes = wait.SerializeAsString();
         AddCredentials(m, 0, /*needs_session=*/false, &r, rng);
         return r;
       },
       JudgeWait, CheckWaitReply});
  // Heartbeat seeds: each worker's, with its session, and a rank nobody
  // holds.
  methods.push_back({kHeartbeatMethod, "Heartbeat", 5, false, 10000,
                     [](const Model& m, Rng& rng) {
                       const int rank = static_cast<int>(Below(rng, kNumWorkers + 1));
                       proto::HeartbeatRequest beat;
                       beat.set_rank(rank);
                       if (StructuredMutations(rng) > 0) beat.set_rank(Interesting32(rng, rank));
                       Request r;
                       r.bytes = beat.SerializeAsString();
                       AddCredentials(m, rank % kNumWorkers, /*needs_session=*/true, &r, rng);
                       return r;
                     },
                     [](const Model& m, const Request& r, int64_t) { return JudgeHeartbeat(m, r); },
                     CheckHeartbeatReply});
  // Describe: read-only, so every parsable request is answered with the
  // job as it stands (its bytes mutated like any other's).
  methods.push_back(
      {kDescribeMethod, "Describe", 2, false, 10000,
       [](const Model& m, Rng& rng) {
         Request r;
         r.bytes = proto::DescribeRequest().SerializeAsString();
         AddCredentials(m, 0, /*needs_session=*/false, &r, rng);
         return r;
       },
       [](const Model&, const Request& r, int64_t) {
         proto::DescribeRequest request;
         if (!request.ParseFromString(r.bytes)) {
           Expectation e = Refused(kInvalidArgument, "unparsable describe");
           e.unparsable_protobuf = true;
           return e;
         }
         return Ok("describe");
       },
       [](const Model& m, const Expectation&, const std::string& reply) -> std::string {
         proto::DescribeReply parsed;
         if (!parsed.ParseFromString(reply)) return "unparsable describe reply";
         if (parsed.version() != kVersion || parsed.num_workers() != kNumWorkers ||
             parsed.registered() != kNumWorkers ||
             parsed.signature_size() != static_cast<int>(m.layout.signature.size())) {
           return absl::StrCat("describe says version ", parsed.version(), ", ",
                               parsed.registered(), " of ", parsed.num_workers(), " workers, ",
                               parsed.signature_size(), " tensors");
         }
         return "";
       }});
  // Restore seeds: each worker's, to the current version, the one
  // before, 0, one ahead, and below 0.
  methods.push_back(
      {kRestoreMethod, "Restore", 5, false, 10000,
       [](const Model& m, Rng& rng) {
         static constexpr int64_t kSeeds[] = {kVersion, kVersion - 1, 0, kVersion + 1, -1};
         const int rank = static_cast<int>(Below(rng, kNumWorkers));
         proto::RestoreRequest restore;
         restore.set_rank(rank);
         restore.set_version(kSeeds[Below(rng, std::size(kSeeds))]);
         for (int i = StructuredMutations(rng); i > 0; --i) {
           if (OneIn(rng, 2)) {
             restore.set_version(Interesting64(rng, kVersion));
           } else {
             restore.set_rank(Interesting32(rng, rank));
           }
         }
         Request r;
         r.bytes = restore.SerializeAsString();
         AddCredentials(m, rank, /*needs_session=*/true, &r, rng);
         return r;
       },
       [](const Model& m, const Request& r, int64_t) { return JudgeRestore(m, r); },
       [](const Model&, const Expectation&, const std::string& reply) -> std::string {
         proto::RestoreReply parsed;
         if (!parsed.ParseFromString(reply)) return "unparsable restore reply";
         if (parsed.version() != kVersion) {
           return absl::StrCat("restore reply says version ", parsed.version());
         }
         return "";
       }});
  // Register seeds: the two workers again (acceptable: rejoins), a third
  // worker, a worker asking for the other's rank.
  methods.push_back(
      {kRegisterMethod, "Register", 20, false, 10000,
       [](const Model& m, Rng& rng) {
         const std::vector<proto::RegisterRequest> seeds = {
             MakeRegister("w0", -1), MakeRegister("w1", 1), MakeRegister("intruder", -1),
             MakeRegister("w0", 1), MakeRegister("intruder", 0)};
         proto::RegisterRequest reg = seeds[Below(rng, seeds.size())];
         for (int i = StructuredMutations(rng); i > 0; --i) MutateRegister(&reg, rng);
         Request r;
         r.bytes = reg.SerializeAsString();
         AddCredentials(m, 0, /*needs_session=*/false, &r, rng);
         return r;
       },
       [](const Model& m, const Request& r, int64_t) { return JudgeRegister(m, r); }, nullptr});
  return methods;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Input `index` of the flood with `seed`: a method, its request and what
// the oracle expects of it.
struct Input {
  const Method* method = nullptr;
  Request request;
  Expectation expect;
};

Input MakeInput(const Model& m, const std::vector<Method>& methods, uint64_t seed, int64_t index) {
  Rng rng(SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(index))));
  int total = 0;
  for (const Method& method : methods) total += method.weight;
  int pick = static_cast<int>(Below(rng, total));
  Input input;
  for (const Method& method : methods) {
    if (pick < method.weight) {
      input.method = &method;
      break;
    }
    pick -= method.weight;
  }
  input.request = input.method->generate(m, rng);
  std::string& bytes = input.request.bytes;
  // Byte-level mutations on 60% of the inputs, up to four each.
  if (Below(rng, 10) < 6) {
    for (uint64_t i = 0, n = 1 + Below(rng, 4); i < n; ++i) {
      MutateBytes(&bytes, input.method->framed, rng);
    }
  }
  // Within the 4 MiB gRPC accepts (a longer request is gRPC's to refuse).
  if (bytes.size() > kMaxMessageBytes) bytes.resize(kMaxMessageBytes);
  input.expect = input.method->judge(m, input.request, input.method->deadline_ms);
  // The job token is checked on every call before anything is read:
  // UNAUTHENTICATED alone, whatever else is wrong or right (gRPC's own
  // INTERNAL for a sync method's unparsable body still comes first).
  if (input.request.job_token.value_or("") != kJobToken) {
    const bool unparsable = input.expect.unparsable_protobuf;
    input.expect = Refused(kUnauthenticated, "no job token, or a wrong one");
    input.expect.unparsable_protobuf = unparsable;
  }
  return input;
}

// How a request's credentials looked, for reports.
std::string DescribeCredentials(const Model& m, const Request& r) {
  std::string token = !r.job_token ? "none" : *r.job_token == kJobToken ? "ok" : "wrong";
  std::string session = "none";
  if (r.session) {
    session = "other";
    if (r.session->empty()) session = "empty";
    if (*r.session == m.foreign_session) session = "foreign";
    for (int rank = 0; rank < kNumWorkers; ++rank) {
      if (*r.session == m.sessions[rank]) session = absl::StrCat("rank ", rank, "'s");
    }
  }
  return absl::StrCat("token ", token, ", session ", session);
}

// ---------------------------------------------------------------------------
// The flood.

int64_t VmRssKb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Memory held: what the allocator keeps free is handed back first (see
// the fixture's SetUp), so that growth means memory still in use (a leak,
// or state that grew). Also returns the allocator's own count of bytes in
// use in `heap_kb`.
int64_t LiveRssKb(int64_t* heap_kb) {
  malloc_trim(0);
  const struct mallinfo2 info = mallinfo2();
  *heap_kb = static_cast<int64_t>((info.uordblks + info.hblkhd) >> 10);
  return VmRssKb();
}

// Protobuf logs every unparsable string field (invalid UTF-8) at ERROR; the
// flood makes thousands, so they are counted instead of printed. A plain
// function pointer is what protobuf's log hook takes.
std::atomic<int64_t> protobuf_logs{0};
absl::Mutex protobuf_logs_mu(absl::kConstInit);
// The first few distinct messages (their first 100 characters), and counts.
std::map<std::string, int64_t>* protobuf_log_kinds ABSL_GUARDED_BY(protobuf_logs_mu) = nullptr;
void CountProtobufLog(google::protobuf::LogLevel, const char*, int, const std::string& message) {
  protobuf_logs.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&protobuf_logs_mu);
  if (protobuf_log_kinds == nullptr) protobuf_log_kinds = new std::map<std::string, int64_t>;
  const std::string kind = message.substr(0, 100);
  auto it = protobuf_log_kinds->find(kind);
  if (it != protobuf_log_kinds->end()) {
    ++it->second;
  } else if (protobuf_log_kinds->size() < 8) {
    (*protobuf_log_kinds)[kind] = 1;
  }
}

struct Report {
  int64_t sent = 0;
  int64_t not_sent = 0;
  int64_t mismatches = 0;
  // Known deviations, tolerated but counted: gRPC's INTERNAL for a plain
  // protobuf method's body that does not parse; a call that ran out of its own
  // deadline on the client (the machine too slow for it), whatever the
  // handler would have said.
  int64_t unparsable_internal = 0;
  int64_t client_deadlines = 0;
  int64_t metadata_overflows = 0;
  struct Latency {
    int64_t calls = 0;
    double total_ms = 0;
    double max_ms = 0;
  };
  std::map<std::string, Latency> latency;  // per method, requests up to 64 KiB
  Latency big_latency;                     // requests over 64 KiB
  std::map<std::string, std::map<std::string, int64_t>> histogram;     // method -> code -> count
  std::map<std::string, std::map<std::string, std::string>> messages;  // the first of each
  std::vector<std::string> examples;                                   // the first mismatches
  double seconds = 0;
  int64_t max_reply_bytes = 0;
};

class Flood {
 public:
  // `isolated`: a connection of its own for the requests whose refusals
  // break the connection (Expectation::echoes_huge_strings).
  Flood(const Model& model, std::vector<Method> methods, grpc::GenericStub* stub,
        grpc::GenericStub* isolated, uint64_t seed)
      : model_(model),
        methods_(std::move(methods)),
        stub_(stub),
        isolated_(isolated),
        seed_(seed) {}

  // Sends inputs from index `*next` on until `count` more have been sent;
  // returns once every reply is in.
  void Run(int64_t count, int64_t* next, Report* report) {
    const absl::Time start = absl::Now();
    int64_t sent = 0;
    while (sent < count) {
      const int64_t index = (*next)++;
      Input input = MakeInput(model_, methods_, seed_, index);
      if (input.expect.outcome == Expectation::Outcome::kNotSent) {
        absl::MutexLock lock(&mu_);
        ++report->not_sent;
        continue;
      }
      const bool waits = input.expect.wait_ms > 5;
      {
        absl::MutexLock lock(&mu_);
        auto has_slot = [this, waits]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return waits ? waiting_in_flight_ < kMaxWaitingInFlight : in_flight_ < kMaxInFlight;
        };
        mu_.Await(absl::Condition(&has_slot));
        ++(waits ? waiting_in_flight_ : in_flight_);
      }
      Reap();
      Start(index, std::move(input), waits, report);
      ++sent;
    }
    {
      absl::MutexLock lock(&mu_);
      auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return in_flight_ == 0 && waiting_in_flight_ == 0;
      };
      mu_.Await(absl::Condition(&drained));
      report->sent += sent;
    }
    Reap();
    report->seconds += absl::ToDoubleSeconds(absl::Now() - start);
  }

 private:
  struct Call {
    int64_t index = 0;
    bool waits = false;
    absl::Time start;
    Input input;
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer reply;
  };

  void Start(int64_t index, Input input, bool waits, Report* report) {
    auto* call = new Call;
    call->index = index;
    call->waits = waits;
    call->start = absl::Now();
    call->input = std::move(input);
    call->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::milliseconds(call->input.method->deadline_ms));
    const Request& r = call->input.request;
    if (r.job_token) call->context.AddMetadata(kJobTokenMetadataKey, *r.job_token);
    if (r.session) call->context.AddMetadata(proto::kSessionMetadataKey, *r.session);
    grpc::Slice slice(r.bytes);
    call->request = grpc::ByteBuffer(&slice, 1);
    grpc::GenericStub* stub = call->input.expect.echoes_huge_strings ? isolated_ : stub_;
    stub->UnaryCall(&call->context, call->input.method->path, grpc::StubOptions(), &call->request,
                    &call->reply,
                    [this, call, report](grpc::Status status) { Finish(call, status, report); });
  }

  // On gRPC's thread: judges the reply; the call is deleted by the
  // issuing thread (Reap), not under gRPC's feet.
  void Finish(Call* call, const grpc::Status& status, Report* report) {
    const Expectation& e = call->input.expect;
    const grpc::StatusCode code = status.error_code();
    // gRPC's own answer when the call's deadline passes on the client.
    const bool client_deadline = code == grpc::StatusCode::DEADLINE_EXCEEDED &&
                                 status.error_message() == "Deadline Exceeded";
    // The client's refusal of a status message too large for its metadata.
    const bool metadata_overflow =
        e.echoes_huge_strings && code == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        absl::StrContains(status.error_message(), "metadata size exceeds limit");
    std::string problem;
    bool tolerated_unparsable = false;
    int64_t reply_bytes = 0;
    if (e.outcome == Expectation::Outcome::kOk) {
      if (code == grpc::StatusCode::OK) {
        const std::string reply = Flatten(call->reply);
        reply_bytes = static_cast<int64_t>(reply.size());
        if (call->input.method->check_ok) problem = call->input.method->check_ok(model_, e, reply);
      } else if (!client_deadline) {
        problem = "expected OK";
      }
    } else if (code == grpc::StatusCode::OK) {
      problem = absl::StrCat("accepted; expected ", CodesString(e.codes));
    } else if ((e.codes & Bit(code)) == 0 && !client_deadline) {
      // gRPC's INTERNAL for an unparsable body and a refusal too large for
      // the status metadata were tolerated once; the service now parses
      // every body itself and bounds what it quotes, so both are mismatches.
      problem = absl::StrCat("expected ", CodesString(e.codes));
    }
    absl::MutexLock lock(&mu_);
    std::string key = CodeName(code);
    if (client_deadline) key += " (client deadline)";
    if (tolerated_unparsable) key += " (gRPC: unparsable request)";
    if (metadata_overflow) key += " (metadata overflow)";
    ++report->histogram[call->input.method->name][key];
    report->metadata_overflows += metadata_overflow;
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - call->start);
    Report::Latency& latency = call->input.request.bytes.size() > (64 << 10)
                                   ? report->big_latency
                                   : report->latency[call->input.method->name];
    ++latency.calls;
    latency.total_ms += ms;
    latency.max_ms = std::max(latency.max_ms, ms);
    std::string& message = report->messages[call->input.method->name][key];
    if (message.empty()) message = status.error_message().substr(0, 160);
    report->client_deadlines += client_deadline;
    report->unparsable_internal += tolerated_unparsable;
    report->max_reply_bytes = std::max(report->max_reply_bytes, reply_bytes);
    if (!problem.empty()) {
      ++report->mismatches;
      if (report->examples.size() < 20) {
        const std::string& bytes = call->input.request.bytes;
        report->examples.push_back(absl::StrCat(
            "input ", call->index, " (", call->input.method->name, ", ", e.why, ", ",
            DescribeCredentials(model_, call->input.request), "): got ", CodeName(code), " \"",
            status.error_message().substr(0, 200), "\": ", problem, "; request (", bytes.size(),
            " bytes) ", absl::BytesToHexString(absl::string_view(bytes).substr(0, 96))));
      }
    }
    --(call->waits ? waiting_in_flight_ : in_flight_);
    done_.push_back(call);
  }

  void Reap() {
    std::vector<Call*> done;
    {
      absl::MutexLock lock(&mu_);
      done.swap(done_);
    }
    for (Call* call : done) delete call;
  }

  const Model& model_;
  const std::vector<Method> methods_;
  grpc::GenericStub* const stub_;
  grpc::GenericStub* const isolated_;
  const uint64_t seed_;
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Call*> done_ ABSL_GUARDED_BY(mu_);
};

// The methods to fuzz: all, or those PS_FUZZ_METHODS names (a comma
// separated list of Method::name, e.g. "Push,Pull").
std::vector<Method> SelectedMethods() {
  std::vector<Method> methods = Methods();
  const char* env = std::getenv("PS_FUZZ_METHODS");
  if (env == nullptr || *env == '\0') return methods;
  const std::vector<std::string> names = absl::StrSplit(env, ',');
  methods.erase(std::remove_if(methods.begin(), methods.end(),
                               [&](const Method& m) {
                                 return std::find(names.begin(), names.end(), m.name) ==
                                        names.end();
                               }),
                methods.end());
  return methods;
}

// Inputs to send: kInputs, or PS_FUZZ_INPUTS for a longer (or shorter) run.
int64_t InputCount() {
  const char* env = std::getenv("PS_FUZZ_INPUTS");
  return env != nullptr ? std::strtoll(env, nullptr, 0) : kInputs;
}

uint64_t Seed() {
  const char* env = std::getenv("PS_FUZZ_SEED");
  return env != nullptr ? std::strtoull(env, nullptr, 0) : kDefaultSeed;
}

// ---------------------------------------------------------------------------
// The fixture: the fuzzed server behind the real service, and a reference
// server that gets the same legitimate pushes and nothing else.

class GrpcServiceFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One malloc arena: glibc gives each thread that contends for the heap
    // an arena of its own, and malloc_trim cannot hand back the free top of
    // those, so VmRSS would keep the high-water of every transient 4 MiB
    // message each of gRPC's threads ever held (measured: +175 MB after
    // 20,000 Register inputs, with 1.8 MB in use), not what the flood left
    // allocated. Set before any thread starts; it changes nothing else.
    mallopt(M_ARENA_MAX, 1);
    auto job = StartJob(&device_);
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = std::move(job).value();
    server_ = job_.server.get();
    auto reference = StartJob(&reference_device_);
    ASSERT_TRUE(reference.ok()) << reference.status();
    reference_job_ = std::move(reference).value();
    reference_ = reference_job_.server.get();
    ServiceOptions options;
    options.job_token = kJobToken;
    service_ = std::make_unique<ParameterServerService>(server_, options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    grpc_server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    grpc::ChannelArguments args;
    // Replies of any size reach the checks (which hold them to 4 MiB).
    args.SetMaxReceiveMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = std::make_unique<grpc::GenericStub>(channel_);
    // A channel of other arguments never shares its connection.
    args.SetString("ps.fuzz.connection", "isolated");
    isolated_stub_ = std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
  }
  void TearDown() override {
    if (service_) service_->Shutdown();
    if (grpc_server_) grpc_server_->Shutdown();
  }

  std::vector<float> PullAll(ParameterServer& server) {
    std::vector<float> out(server.num_parameters());
    auto version = Pull(server, 0, absl::InfiniteFuture(), absl::MakeSpan(out));
    EXPECT_TRUE(version.ok()) << version.status();
    return out;
  }

  // The model of the flood's state, read from the server and checked
  // against the plan.
  Model Snapshot() {
    Model m;
    m.pushed.assign(kNumWorkers, std::vector<bool>(m.layout.total_chunks(), false));
    for (const PlannedPush& push : PlanBeforeFlood()) {
      if (push.iteration != kVersion) continue;
      for (int64_t gc : push.global_chunks) m.pushed[push.rank][gc] = true;
    }
    for (int64_t gc = 0; gc < m.layout.total_chunks(); ++gc) {
      const bool complete = m.pushed[0][gc] && m.pushed[1][gc];
      m.chunk_version.push_back(kVersion + (complete ? 1 : 0));
    }
    m.params = PullAll(*server_);
    m.params_at = job_.params_at;
    m.incarnation = server_->incarnation();
    m.sessions = job_.sessions;
    m.foreign_session = reference_job_.sessions[0];
    return m;
  }

  // The state the flood must not change, as the server reports it.
  void ExpectState(const Model& m) {
    EXPECT_EQ(server_->version(), kVersion);
    EXPECT_EQ(server_->held_elements(), 2);  // w:2 of rank 1
    EXPECT_EQ(server_->signature(), Signature());
    const std::vector<float> params = PullAll(*server_);
    ASSERT_EQ(params.size(), m.params.size());
    EXPECT_EQ(std::memcmp(params.data(), m.params.data(), params.size() * sizeof(float)), 0);
    for (int64_t gc = 0; gc < m.layout.total_chunks(); ++gc) {
      const ParameterServer::ChunkId id{m.layout.key[gc], m.layout.chunk[gc]};
      EXPECT_EQ(server_->HasChunks(kVersion + 1, absl::MakeConstSpan(&id, 1)),
                m.chunk_version[gc] > kVersion)
          << "chunk " << gc;
    }
  }

  grpc::Status Register(const std::string& id, proto::RegisterReply* reply) {
    grpc::ClientContext context;
    context.AddMetadata(kJobTokenMetadataKey, kJobToken);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::RegisterRequest request = MakeRegister(id, -1);
    request.set_identity_proof(IdentityOf(id).proof);
    return proto::ParameterServer::NewStub(channel_)->Register(&context, request, reply);
  }

  // One call with the job token (and `session`, when given), waited for.
  grpc::Status RawCall(const char* method, const std::string& bytes,
                       const std::string& session = "") {
    grpc::ClientContext context;
    context.AddMetadata(kJobTokenMetadataKey, kJobToken);
    if (!session.empty()) context.AddMetadata(proto::kSessionMetadataKey, session);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), reply;
    grpc::Status status;
    absl::Notification done;
    stub_->UnaryCall(&context, method, grpc::StubOptions(), &request, &reply, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  }

  CpuDevice device_{0, 1};
  CpuDevice reference_device_{0, 1};
  Job job_;
  Job reference_job_;
  ParameterServer* server_ = nullptr;
  ParameterServer* reference_ = nullptr;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  std::unique_ptr<grpc::GenericStub> isolated_stub_;
};

TEST_F(GrpcServiceFuzzTest, HostileInputsGetDocumentedStatusesAndChangeNoState) {
  const Model model = Snapshot();
  ExpectState(model);
  const uint64_t seed = Seed();
  std::printf("seed %#llx (PS_FUZZ_SEED overrides it)\n", static_cast<unsigned long long>(seed));

  google::protobuf::LogHandler* old_handler = google::protobuf::SetLogHandler(&CountProtobufLog);
  Flood flood(model, SelectedMethods(), stub_.get(), isolated_stub_.get(), seed);
  Report report;
  int64_t next = 0;
  const int64_t inputs = InputCount();
  int64_t heap_before_kb, heap_warm_kb, heap_after_kb;
  const int64_t rss_before_kb = LiveRssKb(&heap_before_kb);
  // A tenth first, to see whether memory still grows once the allocator and
  // gRPC have warmed up.
  flood.Run(inputs / 10, &next, &report);
  const int64_t rss_warm_kb = LiveRssKb(&heap_warm_kb);
  flood.Run(inputs - inputs / 10, &next, &report);
  const int64_t rss_after_kb = LiveRssKb(&heap_after_kb);
  google::protobuf::SetLogHandler(old_handler);

  std::printf(
      "%lld inputs sent (%lld more generated and kept back: the contract accepts them) "
      "in %.2f s: %.0f inputs/s, %d in flight\n",
      static_cast<long long>(report.sent), static_cast<long long>(report.not_sent), report.seconds,
      report.sent / report.seconds, kMaxInFlight);
  std::printf(
      "VmRSS (after malloc_trim): %lld kB before, %lld kB after %lld inputs, %lld kB after "
      "all (%+lld kB)\n",
      static_cast<long long>(rss_before_kb), static_cast<long long>(rss_warm_kb),
      static_cast<long long>(inputs / 10), static_cast<long long>(rss_after_kb),
      static_cast<long long>(rss_after_kb - rss_before_kb));
  std::printf("malloc in use: %lld kB before, %lld kB, %lld kB after\n",
              static_cast<long long>(heap_before_kb), static_cast<long long>(heap_warm_kb),
              static_cast<long long>(heap_after_kb));
  for (const auto& [method, codes] : report.histogram) {
    std::printf("  %-10s", method.c_str());
    for (const auto& [code, count] : codes)
      std::printf(" %s=%lld", code.c_str(), static_cast<long long>(count));
    std::printf("\n");
  }
  std::printf(
      "tolerated: %lld INTERNAL for unparsable protobuf bodies, %lld metadata "
      "overflows, %lld client deadlines; largest OK reply %lld bytes; protobuf log lines "
      "swallowed %lld\n",
      static_cast<long long>(report.unparsable_internal),
      static_cast<long long>(report.metadata_overflows),
      static_cast<long long>(report.client_deadlines),
      static_cast<long long>(report.max_reply_bytes), static_cast<long long>(protobuf_logs.load()));
  {
    absl::MutexLock lock(&protobuf_logs_mu);
    if (protobuf_log_kinds != nullptr) {
      for (const auto& [kind, count] : *protobuf_log_kinds) {
        std::printf("  protobuf logged %lld x \"%s\"\n", static_cast<long long>(count),
                    kind.c_str());
      }
    }
  }
  for (const auto& [method, latency] : report.latency) {
    std::printf("  %-10s %lld calls, mean %.2f ms, max %.1f ms\n", method.c_str(),
                static_cast<long long>(latency.calls), latency.total_ms / latency.calls,
                latency.max_ms);
  }
  std::printf(
      "  over 64 KiB %lld calls, mean %.2f ms, max %.1f ms\n",
      static_cast<long long>(report.big_latency.calls),
      report.big_latency.calls ? report.big_latency.total_ms / report.big_latency.calls : 0.,
      report.big_latency.max_ms);
  for (const auto& [method, codes] : report.messages) {
    for (const auto& [code, message] : codes) {
      std::printf("  e.g. %s %s: \"%s\"\n", method.c_str(), code.c_str(), message.c_str());
    }
  }
  for (const std::string& example : report.examples) std::printf("MISMATCH %s\n", example.c_str());

  EXPECT_EQ(report.sent, inputs);
  EXPECT_EQ(report.mismatches, 0);
  // Bounded growth. Measured (2 cores): VmRSS +6.1 MB after 100,000 inputs
  // and +6.8 MB after 300,000, the heap in use 2.2 MB and 2.5 MB (4.4 MB
  // at 30,000): what gRPC and the allocator set up once, not a cost per
  // input. 32 MiB is 5x that, and what a leak of 340 bytes per input (a
  // call's state, a waiting pull's record, a held view) would add over
  // 100,000; 16 MiB of heap in use, one of 170 bytes.
  EXPECT_LT(rss_after_kb - rss_before_kb, 32 * 1024);
  EXPECT_LT(heap_after_kb - heap_before_kb, 16 * 1024);
  EXPECT_EQ(service_->waiting_pulls(), 0);

  // 1. Nothing the server shows moved.
  ExpectState(model);

  // 2. The pending sums and held parts are untouched: the iteration
  //    completed with the legitimate pushes (and one more whole iteration)
  //    equals, bit for bit, a server that never saw the flood.
  for (const PlannedPush& push : PlanAfterFlood()) {
    ASSERT_TRUE(Push(*server_, model.layout, push).ok()) << push.rank << " " << push.iteration;
    ASSERT_TRUE(Push(*reference_, model.layout, push).ok()) << push.rank << " " << push.iteration;
  }
  EXPECT_EQ(server_->version(), kVersion + 2);
  EXPECT_EQ(server_->held_elements(), 0);
  const std::vector<float> fuzzed = PullAll(*server_);
  const std::vector<float> reference = PullAll(*reference_);
  ASSERT_EQ(fuzzed.size(), reference.size());
  EXPECT_EQ(std::memcmp(fuzzed.data(), reference.data(), fuzzed.size() * sizeof(float)), 0);

  // 3. The registrations: both workers get their ranks back, a third is
  //    still refused.
  for (int r = 0; r < kNumWorkers; ++r) {
    proto::RegisterReply reply;
    grpc::Status s = Register(kWorkerIds[r], &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply.rank(), r);
    EXPECT_EQ(reply.num_workers(), kNumWorkers);
  }
  proto::RegisterReply reply;
  EXPECT_EQ(Register("intruder", &reply).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

// ---------------------------------------------------------------------------
// Regression tests of what the flood found the service doing against its
// contract, each fixed since (the service parses every body itself, bounds
// what a registration may name, refuses a chunk asked for twice and sample
// counts no sum could hold). The flood keeps the inputs that triggered the
// two costly ones small (kMaxHugePullBytes, kMaxHugeEchoBytes).

// Register, Wait and Heartbeat are plain protobuf methods: a body that does
// not parse is refused by gRPC's generated handler with INTERNAL and an
// empty message before the service's runs (the job token unchecked); the
// proto says INVALID_ARGUMENT (malformed message), as Pull (parsed by the
// service itself) answers. Flood: the "INTERNAL (gRPC: unparsable request)"
// counts.
TEST_F(GrpcServiceFuzzTest, UnparsableProtobufRequestsAreInvalidArgument) {
  const std::string garbage("\xff\xff\xff", 3);
  for (const char* method :
       {kRegisterMethod, kWaitMethod, kHeartbeatMethod, kDescribeMethod, kRestoreMethod}) {
    const grpc::Status s = RawCall(method, garbage);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << " got " << CodeName(s.error_code()) << " \"" << s.error_message() << "\"";
  }
  EXPECT_EQ(RawCall(proto::kPullMethod, garbage).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Register's refusals quote the worker's id, and a signature difference
// quotes the worker's tensor name or whole shape, however long: past
// gRPC's default 8 KiB of metadata the client cannot receive the status
// and gets RESOURCE_EXHAUSTED "received initial metadata size exceeds
// limit" instead of the documented code, and so does every other call in
// flight on that connection (a worker's one channel). Measured: ids of
// 7,000 bytes are answered FAILED_PRECONDITION, 9,000 and more break the
// connection. A 4 MiB request of 4M dimensions makes a 12 MB message and
// ~100 MB of transient heap. Flood: the "(metadata overflow)" counts.
TEST_F(GrpcServiceFuzzTest, ARefusalNeverEchoesAnUnboundedString) {
  // A wait in flight on the same channel, for a version that will not come:
  // the server's DEADLINE_EXCEEDED after 1.5 s is its right answer.
  proto::WaitRequest wait;
  wait.set_version(kVersion + 1);
  wait.set_timeout_ms(1500);
  grpc::Status waited;
  std::thread waiter([&] { waited = RawCall(kWaitMethod, wait.SerializeAsString()); });
  absl::SleepFor(absl::Milliseconds(100));

  // Another model's worker, with a 16 KiB id; then one whose shape has
  // 100,000 dimensions.
  proto::RegisterRequest long_id = MakeRegister(std::string(16 << 10, 'x'), -1);
  long_id.mutable_signature(0)->set_name("v");
  proto::RegisterRequest long_shape = MakeRegister("w2", -1);
  for (int i = 0; i < 100000; ++i) long_shape.mutable_signature(0)->add_shape(1);
  for (const proto::RegisterRequest& request : {long_id, long_shape}) {
    const grpc::Status s = RawCall(kRegisterMethod, request.SerializeAsString());
    // Refused for its size before anything quotes it.
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << CodeName(s.error_code()) << " \"" << s.error_message().substr(0, 100) << "\"";
    EXPECT_LT(s.error_message().size(), 4096u);
  }
  waiter.join();
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << CodeName(waited.error_code()) << " \"" << waited.error_message() << "\"";
  EXPECT_NE(waited.error_message(), "received initial metadata size exceeds limit");
}

// A pull is bounded by chunk_elements elements, but an empty tensor's chunk
// counts none, so one 4 MB request can ask for it 1,000,000 times: the
// server answers OK after ~0.5 s of its CPU, having built a reply of 1M
// chunk entries and 1M data slices (~300 MB of heap for the one call; 64
// such calls in flight would want ~20 GB). The same holds, in smaller
// measure, for any chunk repeated in one request; and with the default
// chunk_elements (1,047,552) a model with a one-element tensor (PReLU's
// weight) can be asked for 1M times, a reply of ~10 MB that no worker can
// receive. Refusing more ids than the model has chunks, or repeats, would
// bound it.
TEST_F(GrpcServiceFuzzTest, APullOfMillionsOfEmptyChunksIsRefused) {
  const std::vector<std::pair<int, int64_t>> ids(1000000, {2, 0});  // e:0, empty
  const std::string request = MakePull(kVersion, 0, ids).SerializeAsString();
  const absl::Time start = absl::Now();
  const grpc::Status s = RawCall(proto::kPullMethod, request);
  std::printf("a pull of %zu ids (%zu bytes): %s after %.0f ms\n", ids.size(), request.size(),
              CodeName(s.error_code()), absl::ToDoubleMilliseconds(absl::Now() - start));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// num_samples is only checked to be >= 0 and the same in one worker's
// pushes, and each chunk sums the workers' counts in an int64: rank 0
// claiming INT64_MAX samples and rank 1 one sample overflow it (undefined
// behaviour; in practice it wraps negative), and the update is skipped as
// if no sample had been seen. Both pushes are OK, the version advances and
// no parameter changes. Found by reading, not by the flood (which never
// sends an acceptable push): a worker with a valid session, buggy or
// hostile, is enough.
TEST_F(GrpcServiceFuzzTest, SampleCountsThatOverflowTheSumAreRefused) {
  const Model model = Snapshot();
  for (size_t i = 0; i < 2; ++i) {  // the rest of iteration 2
    ASSERT_TRUE(Push(*server_, model.layout, PlanAfterFlood()[i]).ok());
  }
  ASSERT_EQ(server_->version(), kVersion + 1);
  const std::vector<float> before = PullAll(*server_);
  Rng rng(1);
  grpc::Status pushed[kNumWorkers];
  const int64_t samples[kNumWorkers] = {std::numeric_limits<int64_t>::max(), 1};
  for (int rank = 0; rank < kNumWorkers; ++rank) {
    const FrameMessage push =
        MakeFrameMessage(model.layout, rank, kVersion + 1, samples[rank], {0, 1, 2, 3, 4}, rng);
    pushed[rank] =
        RawCall(proto::kPushMethod, Serialize(push, /*initialize=*/false), model.sessions[rank]);
  }
  const std::vector<float> after = PullAll(*server_);
  EXPECT_FALSE(pushed[0].ok() && pushed[1].ok())
      << "both accepted; version " << server_->version() << ", parameters "
      << (before == after ? "unchanged" : "updated");
}

}  // namespace
}  // namespace ps::server
