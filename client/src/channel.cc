#include "channel.h"

#include <cstdint>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "wire/channel_args.h"
#include "wire/connect_errno.h"

namespace depot::client_internal {

absl::Status ValidateServerAddress(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server address \"", address, "\" is not of the form host:port"));
  }
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port_text = address.substr(colon + 1);
  uint32_t port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port == 0 || port > 65535 ||
      port_text.find_first_not_of("0123456789") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("server address \"", address,
                     "\" has no valid port (expected 1..65535)"));
  }
  // A bare IPv6 literal has colons in the host; it must be bracketed.
  if (host.front() != '[' && host.find(':') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("server address \"", address,
                     "\": write an IPv6 host in brackets, as [::1]:50051"));
  }
  return absl::OkStatus();
}

StepChannel::StepChannel(std::shared_ptr<grpc::Channel> channel_in)
    : channel(std::move(channel_in)), step_stub(channel) {}

void StepChannel::AwaitSettled(absl::Time deadline) const {
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  while (state == GRPC_CHANNEL_IDLE || state == GRPC_CHANNEL_CONNECTING) {
    if (!channel->WaitForStateChange(state, absl::ToChronoTime(deadline))) {
      return;  // the deadline: the call will say so
    }
    state = channel->GetState(/*try_to_connect=*/true);
  }
}

std::unique_ptr<ServerConnection> Connect(
    const std::string& address, int connections,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  // Several channels connect at once: without this, gRPC 1.51 can fail one of
  // them with a stray ENOENT (wire/connect_errno.h).
  GuardGrpcConnectErrno();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
  args.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
  ApplyClientTransportArgs(&args);
  // Channels with the same target and arguments share one TCP connection
  // through gRPC's global subchannel pool; a channel with a pool of its own
  // opens its own.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto connection = std::make_unique<ServerConnection>();
  connection->address = address;
  for (int i = 0; i < connections; ++i) {
    connection->step_channels.push_back(std::make_unique<StepChannel>(
        grpc::CreateCustomChannel(address, credentials, args)));
  }
  // Every channel starts connecting now, not at its first call.
  for (const std::unique_ptr<StepChannel>& step : connection->step_channels) {
    step->channel->GetState(/*try_to_connect=*/true);
  }
  const std::shared_ptr<grpc::Channel>& first =
      connection->step_channels.front()->channel;
  connection->depot = v1::Depot::NewStub(first);
  connection->health = grpc::health::v1::Health::NewStub(first);
  return connection;
}

void SetDeadline(grpc::ClientContext* context, absl::Time deadline) {
  context->set_deadline(absl::ToChronoTime(deadline));
}

absl::Status WithServer(const absl::Status& status, absl::string_view address) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("server ", address, ": ", status.message()));
}

}  // namespace depot::client_internal
