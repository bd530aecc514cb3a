// The HTTP/2 and TCP settings of Depot's client channels and of its server,
// tuned for the Step stream's bulk chunks; the values and the measurements
// that chose them are in docs/protocol.md ("Transport").
//
// DEPOT_TRANSPORT_ARGS, when set in the environment, adds or overrides
// integer arguments on both sides, as "name=value,name=value" (e.g.
// "grpc.http2.max_frame_size=1048576"): for measuring other settings with
// depot-bench transport without rebuilding. Malformed entries are ignored.
#ifndef DEPOT_COMMON_WIRE_CHANNEL_ARGS_H_
#define DEPOT_COMMON_WIRE_CHANNEL_ARGS_H_

#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"

namespace depot {

void ApplyClientTransportArgs(grpc::ChannelArguments* args);

// For the server's builder (DepotDaemon).
void ApplyServerTransportArgs(grpc::ServerBuilder& builder);

}  // namespace depot

#endif  // DEPOT_COMMON_WIRE_CHANNEL_ARGS_H_
