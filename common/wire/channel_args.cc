#include "wire/channel_args.h"

#include <cstdlib>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "grpc/grpc.h"

namespace depot {
namespace {

// By name, so that the environment replaces a default instead of adding a
// second value under the same name.
using IntArgs = std::map<std::string, int>;

// The settings both sides share (each side's govern what it receives),
// measured with depot-bench transport (docs/protocol.md), then `extra`, then
// DEPOT_TRANSPORT_ARGS.
IntArgs TransportArgs(IntArgs extra = {}) {
  IntArgs args = {
      // Data frames of up to 1 MiB instead of HTTP/2's 16 KiB: a chunk is a
      // few frames, not a hundred.
      {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 1 << 20},
      // A fixed 32 MiB stream window instead of one grown by BDP probing:
      // the Step stream's credits already bound what is in flight, and the
      // probes' pings and the window updates cost CPU at every step.
      {GRPC_ARG_HTTP2_BDP_PROBE, 0},
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 32 << 20},
  };
  for (const auto& [name, value] : extra) args[name] = value;
  if (const char* env = std::getenv("DEPOT_TRANSPORT_ARGS"); env != nullptr) {
    for (absl::string_view entry :
         absl::StrSplit(env, ',', absl::SkipEmpty())) {
      std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(entry, absl::MaxSplits('=', 1));
      int value = 0;
      if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &value)) continue;
      args[std::string(kv.first)] = value;
    }
  }
  return args;
}

}  // namespace

void ApplyClientTransportArgs(grpc::ChannelArguments* args) {
  const IntArgs client_only = {
      // A Step sends slices that reference the caller's gradients, and
      // returns only once gRPC has let go of them (client/src/step_stream.cc).
      // A server that stops reading (hung, stopped, its host gone) would hold
      // them in a socket write that never completes: with keepalive set, gRPC
      // sets TCP_USER_TIMEOUT to the keepalive timeout, and the kernel drops
      // a connection whose data stays unacknowledged that long. The keepalive
      // time itself is a day, so that no ping is ever sent in practice.
      {GRPC_ARG_KEEPALIVE_TIME_MS, 24 * 3600 * 1000},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000},
  };
  for (const auto& [name, value] : TransportArgs(client_only)) {
    args->SetInt(name, value);
  }
}

void ApplyServerTransportArgs(grpc::ServerBuilder& builder) {
  for (const auto& [name, value] : TransportArgs()) {
    builder.AddChannelArgument(name, value);
  }
}

}  // namespace depot
