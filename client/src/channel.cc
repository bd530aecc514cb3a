#include "channel.h"

#include <cstdint>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

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

std::unique_ptr<ServerConnection> Connect(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(kMaxMessageBytes));
  args.SetMaxSendMessageSize(static_cast<int>(kMaxMessageBytes));
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args);
  auto connection = std::make_unique<ServerConnection>();
  connection->address = address;
  connection->depot = v1::Depot::NewStub(channel);
  connection->health = grpc::health::v1::Health::NewStub(channel);
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
