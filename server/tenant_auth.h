// TenantAuth: who is calling. Every Depot RPC but health names its caller's
// tenant (docs/security.md): the tenant of its bearer token
// (--auth_token_file), else the common name of its verified client certificate
// (--tls_client_ca), else, with neither configured, the implicit tenant "" that
// owns every job (the server as it was before tenants).
//
// The token file holds SHA-256 hashes only, one "tenant hex-hash" per line;
// a presented token is hashed and compared with every entry in constant time.
#ifndef DEPOT_SERVER_TENANT_AUTH_H_
#define DEPOT_SERVER_TENANT_AUTH_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"

namespace depot {

// The tenant of a server without --auth_token_file and --tls_client_ca.
inline constexpr char kImplicitTenant[] = "";

using TokenHash = std::array<uint8_t, 32>;

struct TokenEntry {
  std::string tenant;
  TokenHash hash;
};

// Whether `tenant` is a tenant name: 1 to 64 of [A-Za-z0-9_.-].
bool IsValidTenantName(absl::string_view tenant);

// SHA-256 of `data`, lower-case hex (64 characters).
std::string Sha256Hex(absl::string_view data);

// Parses a token file: lines "TENANT SHA256-HEX", blank lines and lines that
// start with '#' ignored. A tenant is 1 to 64 of [A-Za-z0-9_.-]; a tenant may
// have several tokens; a hash may appear once. INVALID_ARGUMENT naming the
// line otherwise, or when the file has no entry.
absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(
    absl::string_view contents);

class TenantAuth {
 public:
  // Reads `token_file` when not empty. `client_certificates`: the server
  // verifies client certificates (--tls_client_ca), and a call must present
  // one. INVALID_ARGUMENT / NOT_FOUND naming the file when it cannot be read
  // or parsed.
  static absl::StatusOr<std::unique_ptr<TenantAuth>> Create(
      const std::string& token_file, bool client_certificates);

  // Whether calls are authenticated at all (a token file or client
  // certificates); false: every call is of kImplicitTenant.
  bool enabled() const { return !tokens_.empty() || client_certificates_; }

  // The tenant of the call. UNAUTHENTICATED, saying what is missing, when it
  // carries no valid token (tokens configured) or no verified client
  // certificate (client certificates configured). The message never says
  // which tenants exist.
  absl::StatusOr<std::string> TenantOf(
      const grpc::ServerContextBase& context) const;

 private:
  TenantAuth(std::vector<TokenEntry> tokens, bool client_certificates)
      : tokens_(std::move(tokens)), client_certificates_(client_certificates) {}

  // The tenant whose token hashes to `hash`, or null. Compares with every
  // entry, whatever matches, so that the time says nothing about the hashes.
  const std::string* TenantOfToken(absl::string_view token) const;

  const std::vector<TokenEntry> tokens_;
  const bool client_certificates_;
};

}  // namespace depot

#endif  // DEPOT_SERVER_TENANT_AUTH_H_
