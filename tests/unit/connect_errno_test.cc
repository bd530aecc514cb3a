// The guard against gRPC 1.51 reading connect()'s errno late
// (common/wire/connect_errno.h): once a client has opened its channels, absl's
// one-time CPU frequency probe must no longer be able to leave errno ENOENT in
// a thread that queues on a mutex, which is what grpc_fd_create does between
// gRPC's connect() and its errno check.
//
// The probe runs once per process, so each case runs in a fresh one (a
// "threadsafe" death test re-executes this binary).
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "channel.h"
#include "gtest/gtest.h"

namespace depot::client_internal {
namespace {

// absl reads this file in its probe; where it exists the probe leaves errno
// alone and neither case below can see the problem.
constexpr char kTscFrequencyFile[] = "/sys/devices/system/cpu/cpu0/tsc_freq_khz";

bool ProbeCanSetErrno() {
  struct stat st;
  return stat(kTscFrequencyFile, &st) != 0;
}

// Two threads queue on one absl::Mutex, the second behind the first (the
// case in which absl reads thread priorities, and on first use the CPU
// frequency). Exits 0 if errno in both stayed 0 across Lock(), else 1 naming
// the error.
[[noreturn]] void QueueTwoWaitersAndExit() {
  absl::Mutex mu;
  std::atomic<int> errors[2] = {0, 0};
  mu.Lock();
  std::thread waiters[2];
  for (int i = 0; i < 2; ++i) {
    waiters[i] = std::thread([&mu, &errors, i] {
      errno = 0;
      mu.Lock();
      errors[i] = errno;
      mu.Unlock();
    });
    // Long enough for the thread to stop spinning and queue.
    absl::SleepFor(absl::Milliseconds(200));
  }
  mu.Unlock();
  for (std::thread& waiter : waiters) waiter.join();
  for (const std::atomic<int>& error : errors) {
    if (error != 0) {
      std::fprintf(stderr, "errno after a queued Lock(): %s\n",
                   std::strerror(error));
      std::_Exit(1);
    }
  }
  std::_Exit(0);
}

class ConnectErrnoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    if (!ProbeCanSetErrno()) {
      GTEST_SKIP() << kTscFrequencyFile
                   << " exists: absl's probe leaves errno alone here";
    }
  }
};

// Shows that the check below can fail: without the guard, the first queued
// waiter of the process gets ENOENT.
TEST_F(ConnectErrnoTest, WithoutTheGuardAQueuedWaiterGetsEnoent) {
  EXPECT_EXIT(QueueTwoWaitersAndExit(), ::testing::ExitedWithCode(1),
              "No such file or directory");
}

TEST_F(ConnectErrnoTest, AfterConnectAQueuedWaiterKeepsErrno) {
  EXPECT_EXIT(
      {
        // No server: Connect does not wait for connections.
        std::unique_ptr<ServerConnection> connection =
            Connect("127.0.0.1:1", 2, grpc::InsecureChannelCredentials());
        QueueTwoWaitersAndExit();
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace depot::client_internal
