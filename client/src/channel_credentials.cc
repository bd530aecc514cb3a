#include "channel_credentials.h"

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace depot::client_internal {
namespace {

absl::StatusOr<std::string> ReadFile(absl::string_view option,
                                     const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.", option, ": cannot read \"", path, "\""));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

absl::StatusOr<std::string> ReadPem(absl::string_view option,
                                    const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFile(option, path);
  if (pem.ok() && pem->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.", option, ": \"", path, "\" is not a PEM file"));
  }
  return pem;
}

// Sends "authorization: Bearer <token>" with every call of the channel.
class BearerToken final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerToken(std::string token)
      : value_(absl::StrCat("Bearer ", token)) {}

  // Nothing here waits: gRPC may call it on its own threads.
  bool IsBlocking() const override { return false; }

  grpc::Status GetMetadata(
      grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
      std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->emplace("authorization", value_);
    return grpc::Status::OK;
  }

 private:
  const std::string value_;
};

absl::StatusOr<std::string> Token(const ClientOptions& options) {
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::string> contents =
        ReadFile("auth_token_file", options.auth_token_file);
    if (!contents.ok()) return contents.status();
    const std::string first_line = contents->substr(0, contents->find('\n'));
    return std::string(absl::StripAsciiWhitespace(first_line));
  }
  return options.auth_token;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientOptions& options) {
  const bool token_given =
      !options.auth_token.empty() || !options.auth_token_file.empty();
  if (!options.auth_token.empty() && !options.auth_token_file.empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions: set auth_token or auth_token_file, not both");
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions: tls_cert_file and tls_key_file go together (mTLS)");
  }
  if (options.tls_ca_file.empty()) {
    if (token_given || !options.tls_cert_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ClientOptions: ", token_given ? "a token" : "a client certificate",
          " needs tls_ca_file (TLS): it is never sent in clear text"));
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadPem("tls_ca_file", options.tls_ca_file);
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *std::move(ca);
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert =
        ReadPem("tls_cert_file", options.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key =
        ReadPem("tls_key_file", options.tls_key_file);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::SslCredentials(ssl);
  if (!token_given) return credentials;
  absl::StatusOr<std::string> token = Token(options);
  if (!token.ok()) return token.status();
  if (token->empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions: the token is empty (auth_token_file's first line?)");
  }
  return grpc::CompositeChannelCredentials(
      credentials, grpc::MetadataCredentialsFromPlugin(
                       std::make_unique<BearerToken>(*std::move(token))));
}

}  // namespace depot::client_internal
