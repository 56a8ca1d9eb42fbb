#include "worker/server_store.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "worker/sharded_parameter_store.h"

namespace ps::worker {
namespace {

// Readings of a RemoteParameterStore or ShardedParameterStore `store`.
template <typename Store>
ServerStoreReadings ReadingsOf(const Store* store) {
  ServerStoreReadings readings;
  readings.bytes_pushed = [store] { return store->bytes_pushed(); };
  readings.bytes_pulled = [store] { return store->bytes_pulled(); };
  readings.staleness = [store] { return store->staleness_histogram(); };
  return readings;
}

}  // namespace

std::vector<std::string> SplitServerList(absl::string_view servers) {
  std::vector<std::string> addresses;
  for (absl::string_view entry : absl::StrSplit(servers, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (!entry.empty()) addresses.emplace_back(entry);
  }
  return addresses;
}

absl::StatusOr<ServerStore> CreateServerStore(absl::string_view servers,
                                              const RemoteStoreOptions& remote) {
  const std::vector<std::string> addresses = SplitServerList(servers);
  if (addresses.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the server list '", servers, "' names no host:port"));
  }
  ServerStore out;
  out.num_shards = static_cast<int>(addresses.size());
  if (addresses.size() == 1) {
    RemoteStoreOptions one = remote;
    one.server_address = addresses[0];
    PS_ASSIGN_OR_RETURN(std::unique_ptr<RemoteParameterStore> store,
                        RemoteParameterStore::Create(one));
    out.readings = ReadingsOf(store.get());
    out.store = std::move(store);
    return out;
  }
  ShardedStoreOptions sharded;
  sharded.shard_addresses = addresses;
  sharded.remote = remote;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ShardedParameterStore> store,
                      ShardedParameterStore::Create(sharded));
  out.readings = ReadingsOf(store.get());
  out.store = std::move(store);
  return out;
}

}  // namespace ps::worker
