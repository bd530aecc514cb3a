// The client's connection to one depot-server: address, channel and stubs, plus
// the small helpers every RPC of the client shares (deadlines, error prefixes).
#ifndef DEPOT_CLIENT_SRC_CHANNEL_H_
#define DEPOT_CLIENT_SRC_CHANNEL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "depot/v1/depot.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"

namespace depot::client_internal {

// The largest gRPC message either side accepts; the server sets the same limit.
inline constexpr size_t kMaxMessageBytes = size_t{64} << 20;

// Room left in a message for everything but a chunk's payload (tags, index,
// header).
inline constexpr size_t kMessageOverheadBytes = 4096;

// The health-service name under which a server reports that it accepts RPCs.
inline constexpr char kDepotServiceName[] = "depot.v1.Depot";

// The most TCP connections a client opens to one server: beyond a few,
// connections only add threads and memory (docs/protocol.md, "Transport").
inline constexpr int kMaxConnectionsPerServer = 16;

// One TCP connection's channel and a generic stub on it, for the Step method
// called raw (grpc::ByteBuffer both ways; raw_bidi_call.h, step_stream.cc)
// so that chunk payloads are never copied through protobuf.
struct StepChannel {
  StepChannel(std::shared_ptr<grpc::Channel> channel_in);

  // Waits, until `deadline` at the latest, while the channel is idle or
  // connecting, so that a Step call starts on a connected channel (or fails
  // fast with UNAVAILABLE on one that cannot connect) instead of waiting
  // inside gRPC for its connection with the caller's gradients lent to it.
  void AwaitSettled(absl::Time deadline) const;

  std::shared_ptr<grpc::Channel> channel;
  // Stateless besides the channel: calls may start from any thread, through
  // a const StepChannel too.
  mutable grpc::GenericStub step_stub;
};

// The Step method's full name, for the generic stub.
inline constexpr char kStepMethod[] = "/depot.v1.Depot/Step";

struct ServerConnection {
  std::string address;
  std::unique_ptr<v1::Depot::Stub> depot;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  // ClientOptions::connections_per_server channels, each its own TCP
  // connection; [0] is the one the stubs above use.
  std::vector<std::unique_ptr<StepChannel>> step_channels;
};

// The client's servers, in shard-plan order.
using Connections = std::vector<std::unique_ptr<ServerConnection>>;

// OK for "host:port" with a non-empty host and a port in 1..65535 (the host may
// be a bracketed IPv6 literal). INVALID_ARGUMENT naming the address otherwise.
absl::Status ValidateServerAddress(absl::string_view address);

// Opens `connections` channels to `address` with `credentials`
// (channel_credentials.h), each with its own TCP connection, with the
// message-size limits above and the transport settings of
// wire/channel_args.h. Does not wait for the connections. REQUIRES:
// ValidateServerAddress(address).ok(), connections >= 1.
std::unique_ptr<ServerConnection> Connect(
    const std::string& address, int connections,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials);

// Sets the context's deadline to `deadline`.
void SetDeadline(grpc::ClientContext* context, absl::Time deadline);

// `status` with its message prefixed by the server's address, code kept; OK
// stays OK.
absl::Status WithServer(const absl::Status& status, absl::string_view address);

}  // namespace depot::client_internal

#endif  // DEPOT_CLIENT_SRC_CHANNEL_H_
