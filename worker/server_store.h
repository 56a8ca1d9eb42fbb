#ifndef PS_WORKER_SERVER_STORE_H_
#define PS_WORKER_SERVER_STORE_H_

// The parameter store of a parameter-server job, over one server or over
// several shards: the one place that turns a server list and the options of
// its connections into a store. The worker daemon (run_worker.cc) and the
// C-ABI client (worker/client/) both build their stores here, so a job
// reached from either behaves the same. Thread-safe: keeps no state.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/parameter_store.h"
#include "worker/remote_parameter_store.h"

namespace ps::worker {

// The addresses of a server list, "host:port" or the shards'
// "host:port,host:port,..." in shard order; entries are trimmed of ASCII
// whitespace and empty ones skipped. Empty for a list that names none.
std::vector<std::string> SplitServerList(absl::string_view servers);

// What a server job's store reports beyond ParameterStore, whichever kind
// it is. Default-constructed (every function empty): no server store, as
// when a worker trains alone.
struct ServerStoreReadings {
  std::function<int64_t()> bytes_pushed;  // tensor bytes over the wire so far
  std::function<int64_t()> bytes_pulled;
  // Push messages by staleness (RemoteParameterStore::staleness_histogram).
  std::function<std::map<int64_t, int64_t>()> staleness;
  bool remote() const { return static_cast<bool>(bytes_pushed); }
};

struct ServerStore {
  std::unique_ptr<ParameterStore> store;
  // Read `store`: call them only while it lives. Thread-safe.
  ServerStoreReadings readings;
  int num_shards = 0;  // 1 for one server
};

// A RemoteParameterStore for a list of one address, a ShardedParameterStore
// over the shards of a longer one; every store connects as `remote` says
// (its server_address is ignored: `servers` says where). Opens no
// connection: gRPC connects at the store's first call (Register).
// Errors: kInvalidArgument for a list that names no address, and what
// RemoteParameterStore::Create or ShardedParameterStore::Create refuse (a
// repeated shard address, connections below 1, an unknown compression),
// with their codes (TLS files that cannot be read: kNotFound and the like).
absl::StatusOr<ServerStore> CreateServerStore(absl::string_view servers,
                                              const RemoteStoreOptions& remote);

}  // namespace ps::worker

#endif  // PS_WORKER_SERVER_STORE_H_
