#include "common/timed_event.h"

#include "absl/strings/str_cat.h"

namespace ps {

absl::string_view EventKindName(EventKind kind) {
  switch (kind) {
    case EventKind::kData: return "data";
    case EventKind::kCompute: return "compute";
    case EventKind::kReduce: return "reduce";
    case EventKind::kCopyToHost: return "copy_to_host";
    case EventKind::kPush: return "push";
    case EventKind::kWait: return "wait";
    case EventKind::kPull: return "pull";
    case EventKind::kCopyToDevice: return "copy_to_device";
    case EventKind::kForward: return "forward";
    case EventKind::kBackward: return "backward";
    case EventKind::kPushMessage: return "push_message";
    case EventKind::kPullMessage: return "pull_message";
    case EventKind::kServerPush: return "server_push";
    case EventKind::kServerUpdate: return "server_update";
    case EventKind::kServerPull: return "server_pull";
  }
  return "unknown";
}

bool IsStepPhase(EventKind kind) {
  return static_cast<int>(kind) <= static_cast<int>(EventKind::kCopyToDevice);
}

std::string LaneName(int32_t lane) {
  if (lane == kTrainerLane) return "trainer";
  if (lane == kServerUpdateLane) return "update";
  if (lane == kServerPullLane) return "pulls";
  if (lane >= ServerPushLane(0)) return absl::StrCat("pushes of rank ", lane - ServerPushLane(0));
  if (lane >= RpcLane(0)) return absl::StrCat("rpc ", lane - RpcLane(0));
  return absl::StrCat("device ", lane - DeviceLane(0));
}

void EventTimer::ReportSince(EventKind kind, int32_t lane, int64_t step, absl::string_view name,
                             int64_t bytes, int64_t start_ns) const {
  if (observer_ == nullptr) return;
  TimedEvent event;
  event.kind = kind;
  event.lane = lane;
  event.step = step;
  event.name = name;
  event.start_ns = start_ns;
  event.end_ns = clock_->NowNanos();
  event.bytes = bytes;
  observer_->OnEvent(event);
}

}  // namespace ps
