#ifndef PS_WORKER_CLIENT_CLIENT_H_
#define PS_WORKER_CLIENT_CLIENT_H_

// The C++ core behind the C ABI (ps_client.h): one worker's connection to a
// parameter-server job for a training loop that is not ours (PyTorch through
// the `ps` Python package, or any language that can call C). It owns a
// ParameterStore (worker/parameter_store.h) and adds what a foreign caller
// needs on top of it: every call checked before it reaches the store (order,
// ranges, buffer sizes, the signature), asynchronous segment calls as
// Operations to wait on or poll instead of callbacks into the caller, and
// the store's thread contract enforced rather than assumed.
//
// Threads: every call is thread-safe. The store's contract (its blocking
// calls one at a time and never while segment calls are in flight) is
// enforced by refusing, never by waiting, so no call blocks on another
// caller's: a call that would break it returns kFailedPrecondition naming
// the call in its way. In detail:
//   - Register, Reconnect, WaitForVersion and PullAll ("exclusive") need no
//     other blocking call running and no Push/Pull in flight;
//   - Members is blocking but may overlap Push/Pull in flight (it waits for
//     a push reply that announces the members), not another blocking call;
//   - Push and Pull start while any number are in flight, from any threads,
//     but not while an exclusive call runs;
//   - registration, SegmentEnds and LossScale never wait and may come at
//     any time after Register.
// The network work runs on the store's threads (gRPC's completion threads,
// the heartbeat thread, one thread per shard); an Operation's completion
// runs no caller code.
//
// Buffers: the caller's, never copied (the store reads and writes them from
// its threads). A pushed segment must not change, and a pulled segment must
// not be read or written, until its Operation is done.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/param_spec.h"
#include "worker/parameter_store.h"
#include "worker/remote_parameter_store.h"

namespace ps::worker::client {

// One asynchronous push or pull: done once the store has run its
// completion, with its status. Thread-safe; shared between the caller's
// handle and the store's completion, so it outlives either.
class Operation {
 public:
  // Called once, by the store's completion (any thread).
  void Finish(absl::Status status);
  // Whether Finish has run.
  bool done() const { return done_.HasBeenNotified(); }
  // Waits until done or `timeout` has passed (InfiniteDuration: no limit);
  // whether it is done.
  bool WaitFor(absl::Duration timeout) const;
  // The completion's status; only once done() (before: kInternal).
  absl::Status status() const;

 private:
  absl::Notification done_;
  absl::Status status_;  // written once, before done_ is notified
};

// Where the job's servers are and how to reach them.
struct ClientOptions {
  // "host:port", or the shards' "host:port,host:port,..." in the same order
  // on every worker (worker/server_store.h).
  std::string servers;
  // The connections' options, as the worker daemon takes them (worker id,
  // rank, connections, compression, shared memory, timeouts, TLS, the job
  // token's value, log). server_address and steps_per_epoch are ignored
  // (Register states the latter).
  RemoteStoreOptions remote;
};

class Client {
 public:
  // Makes the store for a registration stating `steps_per_epoch`.
  using StoreMaker =
      std::function<absl::StatusOr<std::unique_ptr<ParameterStore>>(int64_t steps_per_epoch)>;

  // A client of the servers `options` names. Checks the options by making a
  // store once (server_store.h), which opens no connection; the store that
  // registers is made by Register. Errors: CreateServerStore's.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // A client over the stores `make_store` makes (tests inject their own).
  // Calls it once with 0 to check it can; its error if not.
  static absl::StatusOr<std::unique_ptr<Client>> Create(StoreMaker make_store);

  // Waits for every Push and Pull in flight to finish (they end by the
  // store's deadlines at the latest), then closes the store. Nothing else
  // may be running on this client; Operations outlive it.
  ~Client();

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Registers this worker's model: `signature` in the flat buffers' order
  // (F32 tensors only), `proposed` its initial values (used only when this
  // worker is asked for them: rank 0 of a server without parameters; empty:
  // none to give), and the iterations of one epoch (0: none). Blocks for the
  // server (up to the connect timeout). Returns the job's settings; the
  // first Pull is of its version. Errors: kInvalidArgument for an empty
  // signature, an empty or repeated name, a negative dimension, a dtype other
  // than F32 (each naming the tensor), a `proposed` that is neither empty nor
  // the model's size, a negative steps_per_epoch; kFailedPrecondition when
  // registered already (Reconnect registers again) or another call is in the
  // way; the store's errors (a server that refuses the signature names its
  // first difference; kUnavailable when no server answers in time).
  absl::StatusOr<ParameterStore::Registration> Register(std::vector<ParamSpec> signature,
                                                        absl::Span<const float> proposed,
                                                        int64_t steps_per_epoch);

  // The last registration (Register's or Reconnect's), its segments'
  // ascending end offsets in elements (the last is the model's size), the
  // model's elements and signature. kFailedPrecondition before Register.
  absl::StatusOr<ParameterStore::Registration> registration() const;
  absl::StatusOr<std::vector<int64_t>> SegmentEnds() const;
  absl::StatusOr<int64_t> num_elements() const;

  // Starts pushing segments [first, last) of `gradient` (the whole flat
  // buffer, the model's size; only those segments are read) for
  // `iteration`, summed over this worker's `num_samples` samples (the same
  // in every push of one iteration), and returns at once. The Operation
  // ends with the store's status (the server refuses a non-finite value
  // naming its tensor and element, a push for another iteration than it
  // expects naming both). kInvalidArgument (returned, nothing started) for
  // a range that is not 0 <= first <= last <= the segment count, a buffer
  // of another size, a negative iteration or sample count;
  // kFailedPrecondition before Register or while an exclusive call runs.
  absl::StatusOr<std::shared_ptr<Operation>> Push(int64_t iteration, int64_t num_samples, int first,
                                                  int last, absl::Span<const float> gradient);
  // Starts pulling segments [first, last) of version `version` into
  // `params` (the whole flat buffer; only those segments are written) and
  // returns at once; the server holds the pull until those segments of that
  // version exist (under async and ssp:S it may bring a newer, or an older
  // one within the bound: worker/consistency.h), up to the store's wait
  // timeout (kDeadlineExceeded). Refusals as Push's.
  absl::StatusOr<std::shared_ptr<Operation>> Pull(int64_t version, int first, int last,
                                                  absl::Span<float> params);

  // Blocking: waits until version `version` is published (store's wait
  // timeout); copies version `version` (or what the consistency gives for
  // it) into the whole `params` and returns the version copied. Exclusive.
  absl::Status WaitForVersion(int64_t version);
  absl::StatusOr<int64_t> PullAll(int64_t version, absl::Span<float> params);

  // The ranks taking part in iteration `iteration`, ascending (waits up to
  // the store's rpc timeout for the push reply that announces them, once
  // the pushes of iteration - 1 are done).
  absl::StatusOr<std::vector<int>> Members(int64_t iteration);

  // Dynamic loss scaling: the scale of the next step's loss as the newest
  // pulled parameters carried it; 0 when the server does not scale.
  absl::StatusOr<float> LossScale() const;

  // Registers again with the signature Register gave, after a call failed
  // with a status IsServerLost accepts (the server restarted or came back),
  // waiting for it up to the reconnect timeout and asking for the rank held.
  // `proposed` as Register's. The worker resumes at the returned version.
  // kUnimplemented over several shards (the sharded store cannot). Exclusive.
  absl::StatusOr<ParameterStore::Registration> Reconnect(absl::Span<const float> proposed);

 private:
  explicit Client(StoreMaker make_store);

  // Claims the blocking-call slot for `call` (exclusive: also needs no
  // Push/Pull in flight) and a registration; returns the store, which stays
  // until the client goes. EndBlocking gives the slot back.
  // kFailedPrecondition naming what is in the way.
  absl::StatusOr<ParameterStore*> BeginBlocking(const char* call, bool exclusive);
  // The slot's checks but the registration's (Register's own), under mu_.
  absl::Status CheckBlockingSlot(const char* call, bool exclusive) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void EndBlocking();
  // A Push or Pull's checks (`step` is the iteration or version, as
  // `what_step` says); counts it in flight and returns the store.
  absl::StatusOr<ParameterStore*> BeginSegments(const char* call, const char* what_step,
                                                int64_t step, int first, int last,
                                                size_t buffer_size);
  // The store's completion of a Push or Pull: stops counting it in flight,
  // then finishes `op` (touching this client no more).
  ParameterStore::Done FinishSegments(std::shared_ptr<Operation> op);
  // The segments and size of the store's registration, under mu_.
  void AdoptRegistration(const ParameterStore::Registration& registration)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StoreMaker make_store_;

  mutable absl::Mutex mu_;
  // Set once by Register; replaced by nobody after.
  std::unique_ptr<ParameterStore> store_ ABSL_GUARDED_BY(mu_);
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<ParamSpec> signature_ ABSL_GUARDED_BY(mu_);
  ParameterStore::Registration registration_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> segment_ends_ ABSL_GUARDED_BY(mu_);
  // The blocking call running (null: none) and whether it is exclusive.
  const char* blocking_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool blocking_exclusive_ ABSL_GUARDED_BY(mu_) = false;
  // Push and Pull calls started whose completion has not run yet.
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps::worker::client

#endif  // PS_WORKER_CLIENT_CLIENT_H_
