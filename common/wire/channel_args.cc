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
      // HTTP/2 keepalive: a ping every 10 s, with calls or without, and a
      // connection whose ping goes unanswered for 20 s is closed, so that a
      // blackholed or dead server shows as UNAVAILABLE (which a step
      // retries, client/src/job_impl.cc) instead of a stream that waits
      // until its deadline. With keepalive set, gRPC also sets
      // TCP_USER_TIMEOUT to the timeout: a socket write that stays
      // unacknowledged that long (a server that stopped reading, holding the
      // slices of the caller's gradients a Step lends gRPC) fails too.
      {GRPC_ARG_KEEPALIVE_TIME_MS, 10 * 1000},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000},
      {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
      {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0},
      // Reconnect within 100 ms to 2 s after a connection is lost (gRPC's
      // defaults, 1 s growing to 120 s, would outlast a step's retries).
      // Not grpc.min_reconnect_backoff_ms: gRPC also takes it as the
      // shortest time a connection attempt may take (20 s by default), and
      // a loaded server may need more than a short one.
      // No gRPC-level retries: the client retries steps itself
      // (job_impl.cc), and gRPC 1.51's retry filter holds a call's sent
      // messages until the call commits (a Step stream's lent gradient
      // slices among them).
      {GRPC_ARG_ENABLE_RETRIES, 0},
      {GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100},
      {GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000},
  };
  for (const auto& [name, value] : TransportArgs(client_only)) {
    args->SetInt(name, value);
  }
}

void ApplyServerTransportArgs(grpc::ServerBuilder& builder) {
  const IntArgs server_only = {
      // The clients' keepalive pings (every 10 s) are welcome: gRPC's default
      // would answer pings more often than every 5 minutes with GOAWAY.
      {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000},
      {GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0},
      // The server's own keepalive finds clients that vanished (a blackholed
      // trainer host) within a minute, and ends their streams, so that the
      // chunks they had sent stop holding the place of a retry.
      {GRPC_ARG_KEEPALIVE_TIME_MS, 30 * 1000},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000},
      {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
      // What the server receives ahead of reading it: 8 MiB a stream (2 fp32
      // chunks of the default size, 4 bf16 ones; the reader takes each as it
      // comes). With the clients' 32 MiB, 64 workers that send without
      // waiting had gRPC hold up to about 140 MB of their messages at once,
      // outside the memory budget (docs/protocol.md, "Bounds and memory").
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20},
  };
  for (const auto& [name, value] : TransportArgs(server_only)) {
    builder.AddChannelArgument(name, value);
  }
}

}  // namespace depot
