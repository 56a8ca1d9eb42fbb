// The C ABI (ps_client.h) over client.h's Client: converts the caller's C
// structs into typed options and back, and every absl::Status into a code
// and a message. No logic of its own beyond checking the pointers and
// numbers C can get wrong; no C++ exception crosses it.

#include "worker/client/ps_client.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/job_token.h"
#include "worker/identity_file.h"
#include "common/param_spec.h"
#include "common/status_macros.h"
#include "worker/client/client.h"

struct ps_client {
  std::unique_ptr<ps::worker::client::Client> client;
};

struct ps_handle {
  std::shared_ptr<ps::worker::client::Operation> op;
};

namespace {

using ps::worker::ParameterStore;
using ps::worker::client::Client;
using ps::worker::client::ClientOptions;

// Writes `status` into `error` (if any), the message cut to fit with "..."
// at its end; returns its code.
ps_status Report(const absl::Status& status, ps_error* error) {
  const ps_status code = static_cast<ps_status>(status.code());
  if (error == nullptr) return code;
  error->code = code;
  const absl::string_view message = status.message();
  if (message.size() < PS_ERROR_MESSAGE_SIZE) {
    std::memcpy(error->message, message.data(), message.size());
    error->message[message.size()] = '\0';
  } else {
    const size_t keep = PS_ERROR_MESSAGE_SIZE - 4;
    std::memcpy(error->message, message.data(), keep);
    std::memcpy(error->message + keep, "...", 4);  // with the NUL
  }
  return code;
}

// Runs `body` (returning an absl::Status) and reports its status; an
// exception (memory exhausted, in practice) becomes a status instead of
// crossing the C boundary.
template <typename Body>
ps_status Guarded(ps_error* error, Body body) {
  try {
    return Report(body(), error);
  } catch (const std::bad_alloc&) {
    return Report(absl::ResourceExhaustedError("out of memory"), error);
  } catch (const std::exception& e) {
    return Report(absl::InternalError(absl::StrCat("unexpected exception: ", e.what())), error);
  } catch (...) {
    return Report(absl::InternalError("unexpected exception"), error);
  }
}

absl::Status Required(const void* pointer, const char* call, const char* what) {
  if (pointer != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(call, ": ", what, " is NULL"));
}

std::string Text(const char* s) { return s == nullptr ? std::string() : std::string(s); }

absl::Status CheckAbi(int32_t abi_version, const char* call) {
  if (abi_version == PS_CLIENT_ABI_VERSION) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(call, ": the caller was built for ps_client ABI ", abi_version,
                   ", this library (libps_client.so) speaks ABI ", PS_CLIENT_ABI_VERSION,
                   ": use the header and the library of one build"));
}

absl::StatusOr<absl::Duration> Milliseconds(int64_t ms, const char* field, bool zero_allowed) {
  if (ms < 0 || (ms == 0 && !zero_allowed)) {
    return absl::InvalidArgumentError(absl::StrCat("ps_options.", field, " is ", ms,
                                                   "; it must be ",
                                                   zero_allowed ? "0 or more" : "positive"));
  }
  return absl::Milliseconds(ms);
}

// The typed options of `o`, every number checked; the TLS files, the
// compression and the server list are checked by Client::Connect.
absl::StatusOr<ClientOptions> ToClientOptions(const ps_options& o) {
  PS_RETURN_IF_ERROR(CheckAbi(o.abi_version, "ps_client_connect"));
  ClientOptions out;
  out.servers = Text(o.servers);
  if (out.servers.empty()) {
    return absl::InvalidArgumentError("ps_options.servers is empty: give host:port");
  }
  ps::worker::RemoteStoreOptions& r = out.remote;
  r.worker_id = Text(o.worker_id);
  if (o.rank < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ps_options.rank is ", o.rank, "; -1 (any) or a rank"));
  }
  r.rank = o.rank;
  if (o.connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ps_options.connections is ", o.connections, "; 1 or more"));
  }
  r.connections = o.connections;
  r.compression = Text(o.compression).empty() ? std::string("none") : Text(o.compression);
  r.shared_memory = o.shared_memory != 0;
  PS_ASSIGN_OR_RETURN(r.connect_timeout,
                      Milliseconds(o.connect_timeout_ms, "connect_timeout_ms", false));
  PS_ASSIGN_OR_RETURN(r.rpc_timeout, Milliseconds(o.rpc_timeout_ms, "rpc_timeout_ms", false));
  PS_ASSIGN_OR_RETURN(r.wait_timeout, Milliseconds(o.wait_timeout_ms, "wait_timeout_ms", false));
  PS_ASSIGN_OR_RETURN(r.reconnect_timeout,
                      Milliseconds(o.reconnect_timeout_ms, "reconnect_timeout_ms", false));
  PS_ASSIGN_OR_RETURN(r.heartbeat_interval,
                      Milliseconds(o.heartbeat_interval_ms, "heartbeat_interval_ms", true));
  r.tls.ca_file = Text(o.tls_ca_file);
  r.tls.cert_file = Text(o.tls_cert_file);
  r.tls.key_file = Text(o.tls_key_file);
  r.tls.server_name_override = Text(o.tls_server_name);
  // As the worker daemon: the file first, else the value (its
  // $PS_JOB_TOKEN); "" for neither.
  PS_ASSIGN_OR_RETURN(
      r.job_token,
      ps::ReadJobToken(Text(o.job_token_file), Text(o.job_token).empty() ? nullptr : o.job_token));
  if (!Text(o.identity_file).empty()) {
    PS_ASSIGN_OR_RETURN(r.identity_proof, ps::worker::LoadOrCreateIdentity(Text(o.identity_file)));
  }
  // One line at a time, whichever thread logs.
  auto serial = std::make_shared<absl::Mutex>();
  if (o.log != nullptr) {
    r.log = [serial, log = o.log, context = o.log_context](const std::string& line) {
      absl::MutexLock lock(serial.get());
      log(context, line.c_str());
    };
  } else {
    r.log = [serial](const std::string& line) {
      absl::MutexLock lock(serial.get());
      std::fprintf(stderr, "ps_client: %s\n", line.c_str());
    };
  }
  return out;
}

absl::StatusOr<std::vector<ps::ParamSpec>> ToSignature(const ps_tensor_spec* tensors,
                                                       int64_t num_tensors) {
  PS_RETURN_IF_ERROR(Required(tensors, "ps_client_register", "tensors"));
  if (num_tensors < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ps_client_register: num_tensors is ", num_tensors, "; 1 or more"));
  }
  std::vector<ps::ParamSpec> signature(num_tensors);
  for (int64_t i = 0; i < num_tensors; ++i) {
    const ps_tensor_spec& t = tensors[i];
    ps::ParamSpec& spec = signature[i];
    if (t.name == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " has a NULL name"));
    }
    spec.name = t.name;
    const std::string which = absl::StrCat("tensor ", i, " ('", spec.name, "')");
    if (t.ndim < 0 || t.ndim > PS_MAX_NDIM) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " has ndim ", t.ndim, "; 0 to ", PS_MAX_NDIM));
    }
    if (t.ndim > 0 && t.shape == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " has ndim ", t.ndim, " and a NULL shape"));
    }
    spec.shape.assign(t.shape, t.shape + t.ndim);
    if (t.dtype < PS_DTYPE_F32 || t.dtype > PS_DTYPE_I64) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, " has dtype ", t.dtype, ", which is no PS_DTYPE_*"));
    }
    spec.dtype = static_cast<ps::DType>(t.dtype);
  }
  return signature;
}

// `elements` floats at `data`, or none for NULL and 0.
absl::StatusOr<absl::Span<const float>> InitialValues(const char* call, const float* data,
                                                      int64_t elements) {
  if (data == nullptr && elements == 0) return absl::Span<const float>();
  if (data == nullptr || elements < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": initial values ", data == nullptr ? "NULL" : "given", " with ",
                     elements, " elements; give the model's values, or NULL and 0"));
  }
  return absl::MakeConstSpan(data, static_cast<size_t>(elements));
}

absl::Status CheckBuffer(const char* call, const void* data, int64_t elements) {
  PS_RETURN_IF_ERROR(Required(data, call, "the buffer"));
  if (elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": ", elements, " elements"));
  }
  return absl::OkStatus();
}

void ToC(const ParameterStore::Registration& in, const std::vector<int64_t>& ends,
         ps_registration* out) {
  if (out == nullptr) return;
  std::memset(out, 0, sizeof(*out));
  out->rank = in.rank;
  out->num_workers = in.num_workers;
  out->version = in.version;
  std::snprintf(out->consistency, sizeof(out->consistency), "%s", in.consistency.Name().c_str());
  out->staleness_bound = in.consistency.staleness_bound();
  out->independent_steps = in.consistency.independent_steps() ? 1 : 0;
  out->exact_pulls = in.consistency.exact_pulls() ? 1 : 0;
  out->dynamic_members = in.dynamic_members ? 1 : 0;
  out->loss_scale = in.loss_scale;
  out->num_segments = static_cast<int64_t>(ends.size());
  out->num_elements = ends.empty() ? 0 : ends.back();
  std::snprintf(out->optimizer, sizeof(out->optimizer), "%s", in.optimizer.c_str());
}

absl::Status CheckClient(const ps_client* client, const char* call) {
  return Required(client, call, "the client");
}

// A handle for a started operation.
absl::Status HandOut(absl::StatusOr<std::shared_ptr<ps::worker::client::Operation>> op,
                     ps_handle** handle) {
  if (!op.ok()) return op.status();
  *handle = new ps_handle{std::move(*op)};
  return absl::OkStatus();
}

}  // namespace

extern "C" {

int32_t ps_client_abi_version(void) { return PS_CLIENT_ABI_VERSION; }

const char* ps_status_name(ps_status status) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (status < 0 || status >= static_cast<ps_status>(sizeof(kNames) / sizeof(kNames[0]))) {
    return "UNKNOWN_CODE";
  }
  return kNames[status];
}

ps_status ps_options_init(ps_options* options, int32_t abi_version, ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Required(options, "ps_options_init", "options"));
    PS_RETURN_IF_ERROR(CheckAbi(abi_version, "ps_options_init"));
    const ps::worker::RemoteStoreOptions defaults;
    std::memset(options, 0, sizeof(*options));
    options->abi_version = PS_CLIENT_ABI_VERSION;
    options->rank = defaults.rank;
    options->connections = defaults.connections;
    options->compression = "none";
    options->shared_memory = defaults.shared_memory ? 1 : 0;
    options->connect_timeout_ms = absl::ToInt64Milliseconds(defaults.connect_timeout);
    options->rpc_timeout_ms = absl::ToInt64Milliseconds(defaults.rpc_timeout);
    options->wait_timeout_ms = absl::ToInt64Milliseconds(defaults.wait_timeout);
    options->reconnect_timeout_ms = absl::ToInt64Milliseconds(defaults.reconnect_timeout);
    options->heartbeat_interval_ms = absl::ToInt64Milliseconds(defaults.heartbeat_interval);
    return absl::OkStatus();
  });
}

ps_status ps_client_connect(const ps_options* options, ps_client** client, ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Required(options, "ps_client_connect", "options"));
    PS_RETURN_IF_ERROR(Required(client, "ps_client_connect", "client"));
    *client = nullptr;
    PS_ASSIGN_OR_RETURN(const ClientOptions typed, ToClientOptions(*options));
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> made, Client::Connect(typed));
    *client = new ps_client{std::move(made)};
    return absl::OkStatus();
  });
}

void ps_client_close(ps_client* client) {
  // A destructor that cannot throw: the store's own teardown does not.
  delete client;
}

ps_status ps_client_register(ps_client* client, const ps_tensor_spec* tensors, int64_t num_tensors,
                             const float* initial, int64_t initial_elements,
                             int64_t steps_per_epoch, ps_registration* registration,
                             ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(CheckClient(client, "ps_client_register"));
    PS_ASSIGN_OR_RETURN(std::vector<ps::ParamSpec> signature, ToSignature(tensors, num_tensors));
    PS_ASSIGN_OR_RETURN(absl::Span<const float> proposed,
                        InitialValues("ps_client_register", initial, initial_elements));
    PS_ASSIGN_OR_RETURN(const ParameterStore::Registration got,
                        client->client->Register(std::move(signature), proposed, steps_per_epoch));
    PS_ASSIGN_OR_RETURN(const std::vector<int64_t> ends, client->client->SegmentEnds());
    ToC(got, ends, registration);
    return absl::OkStatus();
  });
}

ps_status ps_client_registration(ps_client* client, ps_registration* registration,
                                 ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(CheckClient(client, "ps_client_registration"));
    PS_RETURN_IF_ERROR(Required(registration, "ps_client_registration", "registration"));
    PS_ASSIGN_OR_RETURN(const ParameterStore::Registration got, client->client->registration());
    PS_ASSIGN_OR_RETURN(const std::vector<int64_t> ends, client->client->SegmentEnds());
    ToC(got, ends, registration);
    return absl::OkStatus();
  });
}

ps_status ps_client_segment_ends(ps_client* client, int64_t* ends, int64_t capacity, int64_t* count,
                                 ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(CheckClient(client, "ps_client_segment_ends"));
    PS_RETURN_IF_ERROR(Required(count, "ps_client_segment_ends", "count"));
    PS_ASSIGN_OR_RETURN(const std::vector<int64_t> got, client->client->SegmentEnds());
    *count = static_cast<int64_t>(got.size());
    if (ends == nullptr) return absl::OkStatus();
    if (capacity < *count) {
      return absl::InvalidArgumentError(absl::StrCat("ps_client_segment_ends: capacity ", capacity,
                                                     " for ", *count, " segments"));
    }
    std::copy(got.begin(), got.end(), ends);
    return absl::OkStatus();
  });
}

ps_status ps_client_push(ps_client* client, int64_t iteration, int64_t num_samples, int32_t first,
                         int32_t last, const float* gradient, int64_t elements, ps_handle** handle,
                         ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(CheckClient(client, "ps_client_push"));
    PS_RETURN_IF_ERROR(Required(handle, "ps_client_push", "handle"));
    *handle = nullptr;
    PS_RETURN_IF_ERROR(CheckBuffer("ps_client_push", gradient, elements));
    return HandOut(client->client->Push(iteration, num_samples, first, last,
                                        absl::MakeConstSpan(gradient, elements)),
                   handle);
  });
}

ps_status ps_client_pull(ps_client* client, int64_t version, int32_t first, int32_t last,
                         float* params, int64_t elements, ps_handle** handle, ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(CheckClient(client, "ps_client_pull"));
    PS_RETURN_IF_ERROR(Required(handle, "ps_client_pull", "handle"));
    *handle = nullptr;
    PS_RETURN_IF_ERROR(CheckBuffer("ps_client_pull", params, elements));
    return HandOut(client->client->Pull(version, first, last, absl::MakeSpan(params, elements)),
                   handle);
  });
}

ps_status ps_handle_wait(ps_handle* handle, int64_t timeout_ms, int32_t* done, ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Required(handle, "ps_handle_wait", "handle"));
    PS_RETURN_IF_ERROR(Required(done, "ps_handle_wait", "done"));
    const absl::Duration timeout =
        timeout_ms < 0 ? absl::InfiniteDuration() : absl::Milliseconds(timeout_ms);
    *done = handle->op->WaitFor(timeout) ? 1 : 0;
    return *done ? handle->op->status() : absl::OkStatus();
  });
}

ps_status ps_handle_poll(ps_handle* handle, int32_t* done, ps_error* error) {
  return ps_handle_wait(handle, 0, done, error);
}

void ps_handle_free(ps_handle* handle) {
  if (handle == nullptr) return;
  handle->op->WaitFor(absl::InfiniteDuration());
  delete handle;
}

ps_status ps_client_wait_for_version(ps_client* client, int64_t version, ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(CheckClient(client, "ps_client_wait_for_version"));
    return client->client->WaitForVersion(version);
  });
}

ps_status ps_client_pull_all(ps_client* client, int64_t version, float* params, int64_t elements,
                             int64_t* pulled_version, ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(CheckClient(client, "ps_client_pull_all"));
    PS_RETURN_IF_ERROR(CheckBuffer("ps_client_pull_all", params, elements));
    PS_ASSIGN_OR_RETURN(const int64_t pulled,
                        client->client->PullAll(version, absl::MakeSpan(params, elements)));
    if (pulled_version != nullptr) *pulled_version = pulled;
    return absl::OkStatus();
  });
}

ps_status ps_client_members(ps_client* client, int64_t iteration, int32_t* ranks, int32_t capacity,
                            int32_t* count, ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(CheckClient(client, "ps_client_members"));
    PS_RETURN_IF_ERROR(Required(count, "ps_client_members", "count"));
    PS_ASSIGN_OR_RETURN(const std::vector<int> members, client->client->Members(iteration));
    *count = static_cast<int32_t>(members.size());
    if (ranks == nullptr) return absl::OkStatus();
    if (capacity < *count) {
      return absl::InvalidArgumentError(
          absl::StrCat("ps_client_members: capacity ", capacity, " for ", *count, " members"));
    }
    std::copy(members.begin(), members.end(), ranks);
    return absl::OkStatus();
  });
}

ps_status ps_client_loss_scale(ps_client* client, float* scale, ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(CheckClient(client, "ps_client_loss_scale"));
    PS_RETURN_IF_ERROR(Required(scale, "ps_client_loss_scale", "scale"));
    PS_ASSIGN_OR_RETURN(*scale, client->client->LossScale());
    return absl::OkStatus();
  });
}

ps_status ps_client_reconnect(ps_client* client, const float* initial, int64_t initial_elements,
                              ps_registration* registration, ps_error* error) {
  return Guarded(error, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(CheckClient(client, "ps_client_reconnect"));
    PS_ASSIGN_OR_RETURN(absl::Span<const float> proposed,
                        InitialValues("ps_client_reconnect", initial, initial_elements));
    PS_ASSIGN_OR_RETURN(const ParameterStore::Registration got,
                        client->client->Reconnect(proposed));
    PS_ASSIGN_OR_RETURN(const std::vector<int64_t> ends, client->client->SegmentEnds());
    ToC(got, ends, registration);
    return absl::OkStatus();
  });
}

}  // extern "C"
