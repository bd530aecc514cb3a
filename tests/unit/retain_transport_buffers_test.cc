// The client library leaves the process's malloc alone unless asked
// (ClientOptions::retain_transport_buffers, depot_retain_transport_buffers):
// a library is a guest in its process. Asked, it sets glibc's mmap threshold
// to 32 MiB, so a 16 MiB block comes from a heap instead of its own mapping.
//
// The thresholds are process-wide and stay set, so each case runs in a fresh
// process (a "threadsafe" death test re-executes this binary).
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/status/statusor.h"
#include "depot/client.h"
#include "depot/depot.h"
#include "gtest/gtest.h"

namespace depot {
namespace {

// Below the 32 MiB threshold Depot sets, above glibc's default 128 KiB (and
// above what the dynamic threshold reaches in a fresh process).
constexpr size_t kBlockBytes = size_t{16} << 20;

void* volatile kept = nullptr;  // keeps the compiler from eliding malloc

// Whether malloc serves a kBlockBytes block with a mapping of its own.
bool BlockIsMapped() {
  const size_t before = mallinfo2().hblks;
  kept = std::malloc(kBlockBytes);
  const bool mapped = mallinfo2().hblks > before;
  std::free(kept);
  return mapped;
}

// Connects with `options` (without a server: Connect does not wait) and
// exits 0 when a block is mapped as `expect_mapped` says, else 1.
[[noreturn]] void ConnectAndExit(ClientOptions options, bool expect_mapped) {
  options.servers = {"127.0.0.1:1"};
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) std::_Exit(2);
  std::_Exit(BlockIsMapped() == expect_mapped ? 0 : 1);
}

class RetainTransportBuffersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    for (const char* name : {"GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_",
                             "MALLOC_TRIM_THRESHOLD_"}) {
      if (std::getenv(name) != nullptr) {
        GTEST_SKIP() << name << " is set: the environment's malloc settings "
                     << "win, and these cases need glibc's defaults";
      }
    }
  }
};

// Shows that the check can tell: in a fresh process with glibc's defaults, a
// 16 MiB block has its own mapping.
TEST_F(RetainTransportBuffersTest, AFreshProcessMapsLargeBlocks) {
  EXPECT_EXIT(std::_Exit(BlockIsMapped() ? 0 : 1), ::testing::ExitedWithCode(0),
              "");
}

TEST_F(RetainTransportBuffersTest, ConnectLeavesMallocAloneByDefault) {
  EXPECT_EXIT(ConnectAndExit(ClientOptions(), /*expect_mapped=*/true),
              ::testing::ExitedWithCode(0), "");
}

TEST_F(RetainTransportBuffersTest, ConnectAskedToRetainKeepsBlocksInTheHeap) {
  ClientOptions options;
  options.retain_transport_buffers = true;
  EXPECT_EXIT(ConnectAndExit(options, /*expect_mapped=*/false),
              ::testing::ExitedWithCode(0), "");
}

TEST_F(RetainTransportBuffersTest, TheCApiSetsThemWhenCalled) {
  EXPECT_EXIT(
      {
        depot_client_options_t options;
        depot_client_options_init(&options);
        const char* servers[] = {"127.0.0.1:1"};
        depot_client_t* client = nullptr;
        if (depot_client_create(servers, 1, &options, &client) != DEPOT_OK) {
          std::_Exit(2);
        }
        if (!BlockIsMapped()) std::_Exit(3);  // depot_client_create: alone
        if (depot_retain_transport_buffers() != 1) std::_Exit(4);
        std::_Exit(BlockIsMapped() ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace depot
