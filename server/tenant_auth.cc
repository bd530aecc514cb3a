#include "server/tenant_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace depot {
namespace {

constexpr size_t kMaxTenantChars = 64;
constexpr absl::string_view kBearerPrefix = "Bearer ";

TokenHash Sha256(absl::string_view data) {
  TokenHash hash{};
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), hash.data(), &size, EVP_sha256(),
             nullptr);
  return hash;
}


int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool ParseHash(absl::string_view hex, TokenHash* hash) {
  if (hex.size() != 2 * hash->size()) return false;
  for (size_t i = 0; i < hash->size(); ++i) {
    const int high = HexDigit(hex[2 * i]);
    const int low = HexDigit(hex[2 * i + 1]);
    if (high < 0 || low < 0) return false;
    (*hash)[i] = static_cast<uint8_t>(high * 16 + low);
  }
  return true;
}

// The common name of the call's verified client certificate, or "".
std::string CertificateCommonName(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  const std::vector<grpc::string_ref> names =
      auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  if (names.empty()) return "";
  return std::string(names.front().data(), names.front().size());
}

}  // namespace

bool IsValidTenantName(absl::string_view tenant) {
  if (tenant.empty() || tenant.size() > kMaxTenantChars) return false;
  for (const char c : tenant) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '-') {
      return false;
    }
  }
  return true;
}

std::string Sha256Hex(absl::string_view data) {
  static constexpr char kHex[] = "0123456789abcdef";
  const TokenHash hash = Sha256(data);
  std::string hex;
  for (const uint8_t byte : hash) {
    hex.push_back(kHex[byte >> 4]);
    hex.push_back(kHex[byte & 15]);
  }
  return hex;
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(
    absl::string_view contents) {
  std::vector<TokenEntry> entries;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    TokenEntry entry;
    if (fields.size() != 2 || !IsValidTenantName(fields[0]) ||
        !ParseHash(fields[1], &entry.hash)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_number,
          ": expected \"TENANT SHA256-HEX\" (a tenant of 1 to 64 of "
          "[A-Za-z0-9_.-], then the 64 hex digits of the token's SHA-256; "
          "depot-server --hash_token makes them)"));
    }
    entry.tenant = std::string(fields[0]);
    for (const TokenEntry& other : entries) {
      if (other.hash == entry.hash) {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", line_number, ": the same token hash is listed twice"));
      }
    }
    entries.push_back(std::move(entry));
  }
  if (entries.empty()) {
    return absl::InvalidArgumentError(
        "no token in it (an empty token file would lock every client out)");
  }
  return entries;
}

absl::StatusOr<std::unique_ptr<TenantAuth>> TenantAuth::Create(
    const std::string& token_file, bool client_certificates) {
  std::vector<TokenEntry> tokens;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) {
      return absl::NotFoundError(
          absl::StrCat("--auth_token_file ", token_file, ": cannot read it"));
    }
    std::stringstream contents;
    contents << in.rdbuf();
    absl::StatusOr<std::vector<TokenEntry>> parsed =
        ParseTokenFile(contents.str());
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--auth_token_file ", token_file, ": ", parsed.status().message()));
    }
    tokens = *std::move(parsed);
  }
  return std::unique_ptr<TenantAuth>(
      new TenantAuth(std::move(tokens), client_certificates));
}

const std::string* TenantAuth::TenantOfToken(absl::string_view token) const {
  const TokenHash presented = Sha256(token);
  const std::string* tenant = nullptr;
  for (const TokenEntry& entry : tokens_) {
    if (CRYPTO_memcmp(entry.hash.data(), presented.data(), presented.size()) ==
        0) {
      tenant = &entry.tenant;
    }
  }
  return tenant;
}

absl::StatusOr<std::string> TenantAuth::TenantOf(
    const grpc::ServerContextBase& context) const {
  if (!enabled()) return std::string(kImplicitTenant);
  std::string common_name;
  if (client_certificates_) {
    common_name = CertificateCommonName(context);
    if (common_name.empty()) {
      return absl::UnauthenticatedError(
          "this server requires a client certificate signed by its "
          "--tls_client_ca (ClientOptions tls_cert_file and tls_key_file)");
    }
  }
  if (tokens_.empty()) return common_name;
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) {
    return absl::UnauthenticatedError(
        "this server requires a token (\"authorization: Bearer <token>\" "
        "metadata; ClientOptions auth_token or auth_token_file)");
  }
  const absl::string_view value(found->second.data(), found->second.size());
  const std::string* tenant =
      absl::StartsWith(value, kBearerPrefix)
          ? TenantOfToken(value.substr(kBearerPrefix.size()))
          : nullptr;
  if (tenant == nullptr) {
    return absl::UnauthenticatedError("the token is not valid on this server");
  }
  return *tenant;
}

}  // namespace depot
