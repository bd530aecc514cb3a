// The watchdog that bounds depot-server's shutdown: it expires at a second
// stop signal, or once its bound has passed, and says which.
#include "server/shutdown_watchdog.h"

#include <pthread.h>
#include <signal.h>

#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace depot {
namespace {

using ::testing::HasSubstr;

// SIGUSR2 stands for the stop signals: blocked in the calling thread while a
// test runs (the watchdog's thread inherits the mask) and sent to the
// watchdog's thread alone, so no other thread of the test binary sees it.
class ShutdownWatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGUSR2);
    ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &signals_, &saved_), 0);
  }
  void TearDown() override { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }

  std::thread Start(absl::Duration bound) {
    return StartShutdownWatchdog(signals_, bound,
                                 [this](const std::string& why) {
                                   why_ = why;
                                   expired_.Notify();
                                 });
  }

  sigset_t signals_;
  sigset_t saved_;
  std::string why_;
  absl::Notification expired_;
};

TEST_F(ShutdownWatchdogTest, ExpiresOnceTheBoundHasPassed) {
  const absl::Time start = absl::Now();
  std::thread watchdog = Start(absl::Milliseconds(200));
  watchdog.join();
  ASSERT_TRUE(expired_.HasBeenNotified());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_THAT(why_, HasSubstr("did not finish within 200ms"));
}

TEST_F(ShutdownWatchdogTest, ExpiresAtASecondSignalBeforeTheBound) {
  const absl::Time start = absl::Now();
  std::thread watchdog = Start(absl::Seconds(600));
  ASSERT_EQ(pthread_kill(watchdog.native_handle(), SIGUSR2), 0);
  watchdog.join();
  ASSERT_TRUE(expired_.HasBeenNotified());
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  EXPECT_THAT(why_, HasSubstr("second signal"));
}

TEST(SignalNameTest, NamesTheStopSignals) {
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGINT), "SIGINT");
}

}  // namespace
}  // namespace depot
