// What the C API's translation units (c_api.cc, engine_c_api.cc) share: the
// handles' definitions and Guarded, which runs an entry point's body.
#ifndef DEPOT_CLIENT_SRC_C_API_INTERNAL_H_
#define DEPOT_CLIENT_SRC_C_API_INTERNAL_H_

#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "depot/client.h"
#include "depot/depot.h"
#include "depot/grad_scaler.h"

struct depot_client {
  std::unique_ptr<depot::Client> client;
};

struct depot_job {
  std::unique_ptr<depot::Job> job;
  // Backing store of depot_server_status_t::server and ::missing_workers of
  // the last Status call.
  std::vector<std::string> status_servers;
  std::vector<std::vector<uint32_t>> status_missing_workers;
};

struct depot_grad_scaler {
  std::unique_ptr<depot::GradScaler> scaler;
};

namespace depot::c_api {

// Records `status` as this thread's last error and returns its code.
int Record(const absl::Status& status) noexcept;

// The message depot_last_error returns.
const char* LastError() noexcept;
// Whether the last error was a RolledBackError, and its step.
bool LastRolledBack(uint64_t* step) noexcept;

// Runs `body` (returning absl::Status) as the entry point `function`: the
// status becomes the return code and the last error; an exception becomes
// INTERNAL (RESOURCE_EXHAUSTED for bad_alloc) naming the function. None may
// unwind into a C (or ctypes) caller.
template <typename Body>
int Guarded(const char* function, Body&& body) noexcept {
  try {
    return Record(body());
  } catch (const std::bad_alloc&) {
    return Record(absl::ResourceExhaustedError(
        absl::StrCat(function, ": out of memory in libdepot_client")));
  } catch (const std::exception& e) {
    return Record(absl::InternalError(absl::StrCat(
        function, ": unexpected C++ exception in libdepot_client: ",
        absl::string_view(e.what()))));
  } catch (...) {
    return Record(absl::InternalError(absl::StrCat(
        function, ": unexpected non-standard exception in libdepot_client")));
  }
}

}  // namespace depot::c_api

#endif  // DEPOT_CLIENT_SRC_C_API_INTERNAL_H_
