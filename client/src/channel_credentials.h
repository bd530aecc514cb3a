// The gRPC channel credentials that ClientOptions' security fields describe:
// plaintext, TLS, mTLS, each with or without a bearer token
// (docs/security.md).
#ifndef DEPOT_CLIENT_SRC_CHANNEL_CREDENTIALS_H_
#define DEPOT_CLIENT_SRC_CHANNEL_CREDENTIALS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "depot/client.h"
#include "grpcpp/security/credentials.h"

namespace depot::client_internal {

// Reads the files the options name. INVALID_ARGUMENT naming the option for a
// combination ClientOptions does not allow, a file that cannot be read or is
// not PEM, or an empty token.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientOptions& options);

}  // namespace depot::client_internal

#endif  // DEPOT_CLIENT_SRC_CHANNEL_CREDENTIALS_H_
